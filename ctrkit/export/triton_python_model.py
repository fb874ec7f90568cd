"""The model of a Triton export with ``--backend python`` (copied as ``<version>/model.py``): Triton's Python backend
runs it, so real Triton serves raw values, as NVIDIA Merlin serves the workflow that made the training data in front
of the model.

A request sends either the raw columns of the training table by name (text as BYTES, numbers as INT64 or FP32, each
of shape [B, 1]; a column left out is refused, or missing in every row where the config's parameter
``missing_columns`` says "missing": ``predict --input``'s rule) or the id inputs (``numerical``, ``categorical`` and
``multi_hot``); every input is optional in the config. The raw columns go through the preprocessing in the version's
directory (``preprocessing.json``, ``vocabularies.parquet``), then ``model.onnx`` runs in ONNX Runtime: the answer is
``ctrkit predict --input``'s on the same rows. The stub's Python must import ctrkit (start ``tritonserver`` with the
environment ctrkit is installed in: docs/serving.md).
"""

from __future__ import annotations

from pathlib import Path


class TritonPythonModel:
    """Triton's Python-backend interface: ``initialize`` once per instance, ``execute`` per batch of requests."""

    def initialize(self, args: dict) -> None:
        import json

        from ctrkit.serve.predictor import Predictor

        self.predictor = Predictor.from_export(Path(args["model_repository"]), version=args["model_version"])
        parameters = json.loads(args.get("model_config") or "{}").get("parameters") or {}
        self.missing_columns = (parameters.get("missing_columns") or {}).get("string_value", "error")
        self.bad_values = (parameters.get("bad_values") or {}).get("string_value", "error")
        signature = self.predictor.signature
        self.names = [t.name for t in signature.raw_inputs] + signature.input_names

    def execute(self, requests: list) -> list:
        import triton_python_backend_utils as pb_utils

        from ctrkit.preprocess.transform import TRITON_SETTINGS, RowError
        from ctrkit.preprocess.values import BadValues

        responses = []
        for request in requests:  # one answer per request, each its own inputs (raw or ids)
            try:
                given = {}
                for name in self.names:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is not None:
                        given[name] = tensor.as_numpy()
                bad = BadValues(self.bad_values)
                output = pb_utils.Tensor("probability", self.predictor.score_named(given, self.missing_columns, bad))
                responses.append(_response(pb_utils, output, bad.count))
            except ValueError as e:  # bad values: the client's error (invalid-argument: HTTP 400), said in words
                text = e.said(TRITON_SETTINGS) if isinstance(e, RowError) else str(e)  # this config's parameters
                code = getattr(pb_utils.TritonError, "INVALID_ARG", None)  # (Triton before 23.05: no codes, a 500)
                error = pb_utils.TritonError(text) if code is None else pb_utils.TritonError(text, code)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
        return responses


def _response(pb_utils, output, bad_values_missing: int):
    """The answer: ``output``, and the count of raw values scored as missing as the response's parameter
    ``bad_values_missing`` (as ``ctrkit serve`` says it) where this Triton's Python backend takes response
    parameters."""
    if bad_values_missing:
        try:
            return pb_utils.InferenceResponse(output_tensors=[output],
                                              parameters={"bad_values_missing": bad_values_missing})  # fmt: skip
        except TypeError:  # (a Python backend without response parameters)
            pass
    return pb_utils.InferenceResponse(output_tensors=[output])
