"""The model repository against hostile names and broken entries: the real server on 127.0.0.1, asked
with the raw paths a client could send; `ctrkit export` with names that lead out of the repository."""

from __future__ import annotations

import http.client
import json
import shutil

import pytest

from tests.conftest import run_process
from tests.faults.conftest import digest, one_line_error
from tests.serve.test_server import Server


def export(checkpoint, out, name, *extra):
    return run_process("export", "--checkpoint", checkpoint, "--format", "triton", "--out", out, "--name", name, *extra)


def raw(server, method: str, path: str) -> tuple[int, str]:
    """``method`` on ``path`` sent byte for byte (no client-side normalisation of ``%2e%2e``)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, body=b"{}" if method == "POST" else None)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def repository(tiny_checkpoint, tmp_path_factory):
    """outer/ is itself a model (config.pbtxt, 1/); the served repository outer/inner/ holds 'ranker' (with an
    empty version 3 beside its good version 1), a link 'escape' to outer/, and 'garbage' (a bad config.pbtxt)."""
    work = tmp_path_factory.mktemp("hostile")
    assert export(tiny_checkpoint, work, "outer").returncode == 0
    repo = work / "outer" / "inner"
    assert export(tiny_checkpoint, repo, "ranker").returncode == 0
    (repo / "ranker" / "3").mkdir()
    (repo / "escape").symlink_to(work / "outer")
    shutil.copytree(repo / "ranker", repo / "garbage")
    (repo / "garbage" / "config.pbtxt").write_text("this is not a model configuration\n")
    server = Server("--model-repository", repo)
    yield server, work
    server.stop()


def test_dot_dot_is_refused_by_every_route(repository):
    server, _ = repository
    for method, path in (("POST", "/v2/repository/models/%2e%2e/load"), ("POST", "/v2/repository/models/../load"),
                         ("GET", "/v2/models/%2e%2e/ready"), ("POST", "/v2/models/%2e%2e/infer"),
                         ("POST", "/v2/repository/models/%2e%2e/unload"), ("GET", "/v2/models/%2E%2E"),
                         ("GET", "/v2/models/ranker/versions/%2e%2e/ready"),
                         ("POST", "/v2/models/a%01b/infer")):  # fmt: skip
        status, body = raw(server, method, path)
        assert status in (400, 404), (path, status, body)
        if status == 400:
            assert "path component" in body or "control character" in body or "version number" in body, body
    status, body = raw(server, "POST", "/v2/repository/index")
    assert ".." not in {m["name"] for m in json.loads(body)}
    assert raw(server, "GET", "/v2/models/..")[0] in (400, 404)


def test_a_link_out_of_the_repository_and_a_garbage_config_are_not_served(repository):
    server, _ = repository
    index = json.loads(raw(server, "POST", "/v2/repository/index")[1])
    states = {(m["name"], m.get("version")): (m["state"], m.get("reason", "")) for m in index}
    escape, garbage = states[("escape", None)], states[("garbage", None)]
    assert escape[0] == "UNAVAILABLE" and "outside the model repository" in escape[1]
    assert garbage[0] == "UNAVAILABLE" and "config.pbtxt" in garbage[1]
    assert raw(server, "GET", "/v2/models/escape/ready")[0] == 404
    assert raw(server, "GET", "/v2/models/garbage/ready")[0] == 404
    status, body = raw(server, "POST", "/v2/repository/models/escape/load")
    assert status == 400 and "outside the model repository" in body


def test_an_empty_version_leaves_the_good_versions_serving(repository):
    server, _ = repository
    index = json.loads(raw(server, "POST", "/v2/repository/index")[1])
    states = {(m["name"], m.get("version")): m["state"] for m in index}
    assert states[("ranker", "1")] == "READY" and states[("ranker", "3")] == "UNAVAILABLE"
    assert raw(server, "GET", "/v2/models/ranker/ready")[0] == 200
    assert raw(server, "GET", "/v2/models/ranker/versions/3/ready")[0] == 404


@pytest.mark.parametrize("name", ["../evil", "..", ".", "a/b", "x\x01y", ""])
def test_export_refuses_a_name_that_is_not_one_path_component(tiny_checkpoint, tmp_path, name):
    repo = tmp_path / "repo"
    assert export(tiny_checkpoint, repo, "kept").returncode == 0
    before = digest(tmp_path)
    proc = export(tiny_checkpoint, repo, name, "--overwrite")
    assert proc.returncode == 2, proc.stderr
    one_line_error(proc.stderr, "export", "--name")
    assert digest(tmp_path) == before


def test_overwrite_replaces_only_the_named_model(tiny_checkpoint, tmp_path):
    repo = tmp_path / "repo"
    assert export(tiny_checkpoint, repo, "a").returncode == 0
    assert export(tiny_checkpoint, repo, "b").returncode == 0
    kept = digest(repo / "a")
    assert export(tiny_checkpoint, repo, "b", "--version", "1", "--overwrite").returncode == 0
    assert export(tiny_checkpoint, repo, "c", "--overwrite").returncode == 0
    assert digest(repo / "a") == kept
    assert sorted(p.name for p in repo.iterdir()) == ["a", "b", "c"]


def test_export_does_not_write_through_a_link_out_of_the_repository(tiny_checkpoint, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    assert export(tiny_checkpoint, tmp_path, "elsewhere").returncode == 0
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "linked").symlink_to(elsewhere)
    before = digest(elsewhere)
    proc = export(tiny_checkpoint, repo, "linked")
    assert proc.returncode == 2
    one_line_error(proc.stderr, "export", "outside the model repository")
    assert digest(elsewhere) == before
