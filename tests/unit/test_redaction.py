"""scheduler/redaction.py: what is masked, what log lines print, and how a masked document
applied back gets its stored secrets."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.errors import ValidationFailed
from scheduler.model import parse_job
from scheduler.redaction import MASK, mask_spec, mask_url, scrub_urls, shown_webhook, unmask_doc

URL = "https://ops:hunter2@api.example:8443/v1/ping?api_key=K3Y&x=1#tok=F7"
HOOK = "https://hooks.example/services/T0/B0/H00K"


def stored(**over: Any) -> dict[str, Any]:
    """A canonical stored document, the way the state machine keeps it."""
    doc: dict[str, Any] = {
        "name": "j", "schedule": "@hourly", "executor": "http",
        "http": {"url": URL, "headers": {"Authorization": "Bearer T0K", "X-Trace": "plain"}},
        "alerts": {"webhook": HOOK, "on": ["failure"]},
    }
    doc.update(over)
    return parse_job(doc).to_doc()


def shell_stored() -> dict[str, Any]:
    return parse_job({"name": "s", "schedule": "@hourly", "executor": "shell",
                      "shell": {"command": ["env"], "env": {"DB_PASSWORD": "pw1", "MODE": "fast"}}}).to_doc()


@pytest.mark.parametrize(("url", "masked"), [
    (URL, "https://***@api.example:8443/v1/ping?***#***"),
    ("https://token@git.example/repo", "https://***@git.example/repo"),
    ("http://h.example/path", "http://h.example/path"),
    ("http://h.example/path?", "http://h.example/path?"),  # an empty query holds nothing
    ("http://h.example?k=v", "http://h.example?***"),
    ("http://[::1]:80/x?k=v", "http://[::1]:80/x?***"),
])
def test_mask_url_hides_user_info_query_and_fragment(url: str, masked: str) -> None:
    assert mask_url(url) == masked


@pytest.mark.parametrize(("url", "shown"), [
    (HOOK, "https://hooks.example/***"),
    ("https://u:p@hooks.example:444/x?y=1", "https://hooks.example:444/***"),
    ("http:///T0/B0/s3cr3t", "http:///***"),
    ("not a url/s3cr3t", MASK),
])
def test_shown_webhook_keeps_the_origin_only(url: str, shown: str) -> None:
    assert shown_webhook(url) == shown


def test_scrub_urls_masks_every_url_in_a_message() -> None:
    text = f"bad response, url='{URL}'; redirected to http://other.example/cb?code=C0DE then done"
    scrubbed = scrub_urls(text)
    assert scrubbed == ("bad response, url='https://***@api.example:8443/v1/ping?***#***'; "
                        "redirected to http://other.example/cb?*** then done")
    assert scrub_urls(f"POST {HOOK} failed", shown_webhook) == "POST https://hooks.example/*** failed"
    assert scrub_urls("no url here: host 10.0.0.1:80") == "no url here: host 10.0.0.1:80"
    assert scrub_urls("to http://[::1]:80/x?k=v failed") == "to http://[::1]:80/x?*** failed"
    assert scrub_urls("(see http://h.example/x?k=v).") == "(see http://h.example/x?***)."


def test_mask_spec_masks_each_secret_and_leaves_the_stored_document_alone() -> None:
    spec = stored()
    before = repr(spec)
    masked = mask_spec(spec)
    assert masked["http"]["url"] == "https://***@api.example:8443/v1/ping?***#***"
    assert masked["http"]["headers"] == {"Authorization": MASK, "X-Trace": MASK}
    assert masked["alerts"]["webhook"] == MASK
    assert masked["alerts"]["on"] == ["failure"] and masked["schedule"] == "@hourly"
    assert repr(spec) == before
    for secret in ("hunter2", "K3Y", "F7", "T0K", "plain", "H00K"):
        assert secret not in repr(masked)

    env = mask_spec(shell_stored())["shell"]
    assert env["env"] == {"DB_PASSWORD": MASK, "MODE": MASK} and env["command"] == ["env"]
    assert mask_spec(stored(alerts={"on": ["failure"]}))["alerts"]["webhook"] is None  # nothing to hide


def test_a_masked_document_unmasks_to_the_stored_one() -> None:
    for spec in (stored(), shell_stored()):
        assert unmask_doc(mask_spec(spec), spec) == spec


def test_unmask_keeps_the_parts_a_writer_changed() -> None:
    spec = stored()
    doc = mask_spec(spec)
    doc["http"]["url"] = "https://***@api2.example/v2/ping?***"
    doc["http"]["headers"] = {"Authorization": "Bearer NEW", "X-Trace": MASK, "X-New": "n"}
    doc["alerts"]["webhook"] = "https://hooks.example/other"
    out = unmask_doc(doc, spec)
    assert out["http"]["url"] == "https://ops:hunter2@api2.example/v2/ping?api_key=K3Y&x=1"
    assert out["http"]["headers"] == {"Authorization": "Bearer NEW", "X-Trace": "plain", "X-New": "n"}
    assert out["alerts"]["webhook"] == "https://hooks.example/other"
    assert doc["http"]["headers"]["X-Trace"] == MASK  # the input is not changed


def test_mask_where_nothing_is_stored_names_each_field() -> None:
    doc = {"name": "j", "schedule": "@hourly", "executor": "http",
           "http": {"url": "https://***@h.example/x?***", "headers": {"Authorization": MASK}},
           "alerts": {"webhook": MASK}}
    with pytest.raises(ValidationFailed) as err:
        unmask_doc(doc, None)
    fields = [d["field"] for d in err.value.details]
    assert sorted(set(fields)) == ["alerts.webhook", "http.headers.Authorization", "http.url"]
    assert fields.count("http.url") == 2  # user info and query, each named

    no_query = stored(http={"url": "https://h.example/x", "headers": {}})
    with pytest.raises(ValidationFailed) as err:
        unmask_doc({**no_query, "http": {**no_query["http"], "url": "https://h.example/x?***"}}, no_query)
    assert [d["field"] for d in err.value.details] == ["http.url"]
    assert "query" in err.value.details[0]["message"]

    env_doc = {**shell_stored(), "shell": {"command": ["env"], "env": {"OTHER": MASK}}}
    with pytest.raises(ValidationFailed) as err:
        unmask_doc(env_doc, shell_stored())
    assert [d["field"] for d in err.value.details] == ["shell.env.OTHER"]


def test_documents_without_masks_or_of_another_shape_pass_through() -> None:
    spec = stored()
    assert unmask_doc(spec, spec) == spec
    assert unmask_doc([1, 2], spec) == [1, 2]
    odd = {"http": "not an object", "shell": {"env": ["x"]}, "alerts": None}
    assert unmask_doc(odd, spec) == odd
