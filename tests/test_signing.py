"""Tests for Standard Webhooks signing."""

import base64
import time

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from webhooks.delivery.signing import generate_secret, sign, signature_header, webhook_headers

KNOWN_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KNOWN_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
KNOWN_TIMESTAMP = 1614265330
KNOWN_BODY = b'{"test": 2432232314}'
KNOWN_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def _headers(secrets, body=KNOWN_BODY):
    return webhook_headers(
        secrets=secrets,
        msg_id=KNOWN_ID,
        timestamp=int(time.time()),
        body=body,
        user_agent="Herald-Webhooks/test",
    )


def test_known_answer_from_the_standard():
    assert (
        sign(secret=KNOWN_SECRET, msg_id=KNOWN_ID, timestamp=KNOWN_TIMESTAMP, body=KNOWN_BODY)
        == KNOWN_SIGNATURE
    )


def test_headers_have_the_standard_names_and_values():
    headers = webhook_headers(
        secrets=[KNOWN_SECRET],
        msg_id=KNOWN_ID,
        timestamp=KNOWN_TIMESTAMP,
        body=KNOWN_BODY,
        user_agent="Herald-Webhooks/1.0",
    )
    assert headers == {
        "content-type": "application/json",
        "webhook-id": KNOWN_ID,
        "webhook-timestamp": "1614265330",
        "webhook-signature": KNOWN_SIGNATURE,
        "user-agent": "Herald-Webhooks/1.0",
    }


def test_headers_verify_with_the_reference_library():
    headers = _headers([KNOWN_SECRET])
    assert Webhook(KNOWN_SECRET).verify(KNOWN_BODY, headers) == {"test": 2432232314}


def test_utf8_body_verifies_with_the_reference_library():
    body = '{"name":"Zoë ✓"}'.encode()
    headers = _headers([KNOWN_SECRET], body=body)
    assert Webhook(KNOWN_SECRET).verify(body, headers) == {"name": "Zoë ✓"}


def test_two_secrets_give_two_signatures_each_verifying_alone():
    old, new = KNOWN_SECRET, generate_secret()
    headers = _headers([old, new])
    signatures = headers["webhook-signature"].split(" ")
    assert len(signatures) == 2
    assert all(s.startswith("v1,") for s in signatures)
    ts = int(headers["webhook-timestamp"])
    assert signatures == [
        sign(secret=old, msg_id=KNOWN_ID, timestamp=ts, body=KNOWN_BODY),
        sign(secret=new, msg_id=KNOWN_ID, timestamp=ts, body=KNOWN_BODY),
    ]
    Webhook(old).verify(KNOWN_BODY, headers)
    Webhook(new).verify(KNOWN_BODY, headers)


def test_wrong_secret_fails_to_verify():
    headers = _headers([KNOWN_SECRET])
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(KNOWN_BODY, headers)


def test_tampered_body_fails_to_verify():
    headers = _headers([KNOWN_SECRET])
    with pytest.raises(WebhookVerificationError):
        Webhook(KNOWN_SECRET).verify(b'{"test": 2432232315}', headers)


def test_generate_secret_is_32_random_bytes_and_round_trips():
    secret = generate_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) == 32
    assert generate_secret() != secret
    headers = _headers([secret])
    Webhook(secret).verify(KNOWN_BODY, headers)


def test_signature_header_requires_a_sequence_of_secrets():
    with pytest.raises(ValueError):
        signature_header(secrets=[], msg_id=KNOWN_ID, timestamp=KNOWN_TIMESTAMP, body=KNOWN_BODY)
    with pytest.raises(TypeError):
        signature_header(
            secrets=KNOWN_SECRET, msg_id=KNOWN_ID, timestamp=KNOWN_TIMESTAMP, body=KNOWN_BODY
        )
