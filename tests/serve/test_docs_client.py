"""The serving page's client example, run as written against the real server."""

import re
from pathlib import Path

import numpy as np

from ctrkit.serve.predictor import Predictor
from tests.serve.test_server import Server

PAGE = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def test_documented_client_example_runs_against_the_server(tiny_checkpoint):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    example = next(b for b in blocks if "InferenceServerClient" in b)
    server = Server("--checkpoint", tiny_checkpoint)
    try:
        scope: dict = {}
        exec(example.replace("127.0.0.1:8000", server.url), scope)  # noqa: S102 - our own documentation
    finally:
        server.stop()
    want = Predictor.from_checkpoint(tiny_checkpoint)(scope["numerical"], scope["categorical"])
    assert scope["probability"].shape == (1024, 1)
    np.testing.assert_allclose(scope["probability"], want, atol=1e-5)
