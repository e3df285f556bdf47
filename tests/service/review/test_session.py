"""service/review/session.py: the sign-in's double-submit token must be one this server signed."""

from __future__ import annotations

import time

from service.config import ReviewConfig, ReviewerConfig
from service.review.session import LOGIN_TTL_S, ReviewerAuth


def auth(secret: str = "s" * 32) -> ReviewerAuth:
    reviewers = {"ann": ReviewerConfig(token="ann-review-token-0001")}  # type: ignore[call-arg]
    return ReviewerAuth(ReviewConfig(reviewers=reviewers, session_secret=secret))  # type: ignore[arg-type]


def test_a_token_this_server_signed_passes_while_fresh() -> None:
    server = auth()
    token = server.new_login_token()
    assert server.login_token_ok(token, token)
    later = time.time() + LOGIN_TTL_S + 1
    assert not server.login_token_ok(token, token, now=later)  # expired


def test_equal_header_and_cookie_are_not_enough() -> None:
    server = auth()
    token = server.new_login_token()
    nonce, expires, signature = token.split(".")
    made_up = [
        "anything-an-attacker-likes",  # the pair the old check accepted
        f"{nonce}.{expires}.{'A' * len(signature)}",  # forged signature
        f"{nonce}x.{expires}.{signature}",  # another nonce under the same signature
        f"{nonce}.{int(expires) + 10**6}.{signature}",  # a later expiry under the same signature
        auth("t" * 32).new_login_token(),  # signed under another secret
        "",
    ]
    for forged in made_up:
        assert not server.login_token_ok(forged, forged), forged
    assert not server.login_token_ok(token, None) and not server.login_token_ok(None, token)
    assert not server.login_token_ok(token, server.new_login_token())  # two good tokens, not equal
