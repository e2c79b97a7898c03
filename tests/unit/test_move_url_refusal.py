"""A move into a cell whose URL policy refuses the tenant's URLs is refused before it starts."""

from __future__ import annotations

from cellplane_operator.domain.moves import RefusalReason, refused_urls


def test_the_refusal_names_each_field_and_reason_and_ends_the_move() -> None:
    assert refused_urls("b1", []) is None
    refusal = refused_urls("b1", [
        {"field": "targets[1].url", "url": "http://127.0.0.1:9/run",
         "reason": "host 127.0.0.1: an address inside the platform's network"},
        {"field": "webhooks[0].url", "url": "http://[2002:7f00:1::]/hook",
         "reason": "host 2002:7f00:1::: 2002:7f00:1:: carries the IPv4 address 127.0.0.1"}])
    assert refusal is not None
    assert refusal.reason is RefusalReason.URL_REFUSED
    assert refusal.message.startswith(
        "cell b1 refuses the tenant's spec.targets[1].url (http://127.0.0.1:9/run): host 127.0.0.1")
    assert "spec.webhooks[0].url (http://[2002:7f00:1::]/hook)" in refusal.message
    # Nothing the world does lifts it: the move fails rather than waits.
    assert not refusal.reason.waits
