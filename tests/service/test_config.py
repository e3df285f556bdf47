"""Configuration precedence (file < env < flags), validation errors, and the sample-key refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config import SAMPLE_API_KEY, ConfigError, describe_settings, load_config


def test_defaults_run_embedded_on_loopback() -> None:
    config = load_config(environ={})
    assert config.server.host == "127.0.0.1"
    assert config.server.port == 4318 and config.server.grpc_port == 4317
    assert config.store_url.startswith("sqlite:///")
    assert config.auth.api_keys == {}


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "ragmon.yaml"
    path.write_text("server:\n  port: 5000\n  host: 0.0.0.0\nassembler:\n  grace_s: 2\n")
    env = {"RAGMON_SERVER__PORT": "6000", "RAGMON_AUTH__API_KEYS": '{"k-1": "acme"}'}
    config = load_config(config_file=path, environ=env, overrides={"server": {"host": "127.0.0.2"}})
    assert config.server.port == 6000  # env beats file
    assert config.server.host == "127.0.0.2"  # flag beats file
    assert config.assembler.grace_s == 2.0  # file beats default
    assert config.auth.api_keys == {"k-1": "acme"}


def test_unknown_key_inside_a_section_is_an_error_but_foreign_env_is_ignored() -> None:
    with pytest.raises(ConfigError, match=r"assembler\.grace"):
        load_config(environ={"RAGMON_ASSEMBLER__GRACE": "1"})
    assert load_config(environ={"RAGMON_SHARED_DATA": "/x"}).server.port == 4318


@pytest.mark.parametrize(
    ("env", "where"),
    [
        ({"RAGMON_SERVER__PORT": "70000"}, "server.port"),
        ({"RAGMON_ASSEMBLER__GRACE_S": "-1"}, "assembler.grace_s"),
        ({"RAGMON_BUS__LINGER_S": "6"}, "bus.linger_s"),  # past its 5 s bound: a batch waits too long
        ({"RAGMON_JUDGING__IDLE_POLL_MAX_S": "0"}, "judging.idle_poll_max_s"),
    ],
)
def test_bad_values_name_the_setting(env: dict[str, str], where: str) -> None:
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        load_config(environ=env)


def test_bad_file_is_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid"):
        load_config(config_file=path, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(config_file=tmp_path / "missing.yaml", environ={})


def test_sample_key_refused_unless_dev() -> None:
    env = {"RAGMON_AUTH__API_KEYS": f'{{"{SAMPLE_API_KEY}": "demo"}}'}
    with pytest.raises(ConfigError, match="sample API key"):
        load_config(environ=env)
    assert load_config(environ={**env, "RAGMON_DEV": "true"}).dev is True


def test_every_setting_is_documented() -> None:
    rows = describe_settings()
    names = [r[0] for r in rows]
    assert "RAGMON_SERVER__PORT" in names and "RAGMON_ASSEMBLER__MAX_SPANS" in names
    assert all(description for *_, description in rows)


def test_scalar_env_values_stay_strings_so_numeric_secrets_survive() -> None:
    config = load_config(environ={"RAGMON_JUDGE__API_KEY": "0123456789", "RAGMON_SERVER__PORT": "5001"})
    assert config.judge.api_key is not None and config.judge.api_key.get_secret_value() == "0123456789"
    assert config.server.port == 5001  # converted by field type
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(environ={"RAGMON_AUTH__API_KEYS": "{broken"})
