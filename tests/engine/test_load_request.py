"""`/v1/load_lora_adapter`'s two forms (engine/adapter_admin.py parse_load): a local path, the
adapter's bundle hash (fetched from the engine's adapter source), or both; neither is a 400
naming the field. And the gateway's side of it (gateway/engines/http.py load_body): loragate
engines get the hash (and the directory store's path when there is one); vLLM only a path, or
nothing (its resolver plugin fetches on the first request)."""

from __future__ import annotations

import json

import pytest

from engine.adapter_admin import LoadRequest, parse_load
from gateway.engines.http import load_body
from gateway.policy import AdapterRef

SHA = "ab" * 32


def _parse(body: dict[str, object]) -> LoadRequest:
    return parse_load(json.dumps(body).encode(), base_model_name="tiny")


def test_a_path_a_hash_or_both() -> None:
    assert _parse({"lora_name": "a", "lora_path": "/x"}) == LoadRequest("a", "/x", None)
    assert _parse({"lora_name": "a", "lora_sha256": SHA}) == LoadRequest("a", None, SHA)
    both = _parse({"lora_name": "a", "lora_path": "/x", "lora_sha256": SHA})
    assert both == LoadRequest("a", "/x", SHA)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"lora_name": "a"}, "lora_path"),
        ({"lora_name": "a", "lora_sha256": 5}, "lora_sha256"),
        ({"lora_name": "a", "lora_path": ["/x"]}, "lora_path"),
        ({"lora_path": "/x"}, "lora_name"),
    ],
)
def test_neither_or_the_wrong_types_are_400s_naming_the_field(
    body: dict[str, object], param: str
) -> None:
    with pytest.raises(Exception) as caught:
        _parse(body)
    assert getattr(caught.value, "param", None) == param
    assert getattr(caught.value, "status_code", None) == 400


def _ref(path: str) -> AdapterRef:
    return AdapterRef(
        adapter_id="v1", name="n", owner_tenant_id=None, path=path, created_at=0.0, sha256=SHA
    )


def test_what_the_gateway_asks_each_kind_of_engine_to_load() -> None:
    assert load_body(_ref(""), vllm=False) == {"lora_name": "v1", "lora_sha256": SHA}
    assert load_body(_ref("/store/blobs/x"), vllm=False) == {
        "lora_name": "v1", "lora_sha256": SHA, "lora_path": "/store/blobs/x",
    }  # fmt: skip
    assert load_body(_ref(""), vllm=True) is None  # the resolver plugin fetches it
    assert load_body(_ref("/store/blobs/x"), vllm=True) == {
        "lora_name": "v1", "lora_path": "/store/blobs/x",
    }  # fmt: skip
