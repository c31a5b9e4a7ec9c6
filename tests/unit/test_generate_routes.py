"""The generate routes over the HTTP front end, in process: a model that answers once answers
generate and generate_stream, and both go through the model's front-end admission as infer
requests do."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.unit.test_server_app import W, serving


async def test_generate_answers_through_admission(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, _, plane):
        pixels = np.arange(8, dtype=np.float32)
        resp = await client.post("/v2/models/fake/generate", json={"pixels": pixels.tolist()})
        assert resp.status == 200, await resp.text()
        doc = await resp.json()
        np.testing.assert_allclose(doc["logits"], (pixels.reshape(2, 4) @ W).ravel())
        state = plane.admission.model("fake")
        assert state.inflight == 0  # admitted, then released once answered
        state.limit = 0  # the model is over its admission limit
        for route in ("generate", "generate_stream"):
            resp = await client.post(f"/v2/models/fake/{route}", json={"pixels": [0.0] * 4})
            assert resp.status == 503
            assert "admission limit" in (await resp.json())["error"]


async def test_a_body_past_a_mebibyte_is_decoded_off_the_loop_and_answered(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, _, _):
        pixels = np.ones(4 * 65536, dtype=np.float32)
        body = {"pixels": pixels.tolist()}
        resp = await client.post("/v2/models/fake/generate_stream", json=body)
        assert resp.status == 200
        text = await resp.text()
        assert text.startswith("data: {") and text.endswith("}\n\n") and text.count("data: ") == 1
