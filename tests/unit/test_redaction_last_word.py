"""Redaction goes by a name's last word: ``api_key``, ``hf_token``, ``admin_api_key`` are hidden;
``prefill_per_token_s`` (a timing) and ``max_total_tokens`` (a count) are shown, in ``/-/engines``'
redaction itself and on the evidence side (``summary.json``, the llm-d reports), which redacts the
engines' arguments again on the way out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.evidence.cli import main as evidence
from exporter.proxy.engines import REDACTED, is_secret_name, redact

from tests.report_records import write_records

SECRET = "sk-live-SECRET-9"
SHOWN = {"prefill_per_token_s": 2.0e-5, "max_total_tokens": 4096, "max_prefill_tokens": 16384,
         "tokenizer_path": "/w/m", "token_ids": True, "decode_per_token_s": 0.004, "skip_tokenizer_init": False}
HIDDEN = ("api_key", "hf_token", "admin_api_key", "Admin_API_KEY", "apiKey", "authToken", "HFTOKEN",
          "ssl_keyfile_password", "client_secret", "aws_credentials", "secret_sauce")


@pytest.mark.parametrize("name", HIDDEN)
def test_a_name_whose_last_word_is_a_secret_is_hidden(name: str) -> None:
    assert is_secret_name(name)
    assert redact({name: SECRET}) == {name: REDACTED}


@pytest.mark.parametrize("name", sorted(SHOWN))
def test_a_word_inside_a_name_does_not_hide_it(name: str) -> None:
    assert not is_secret_name(name)
    assert redact({name: SHOWN[name]}) == {name: SHOWN[name]}


def test_command_line_words_by_their_flags_last_word() -> None:
    argv = ["--prefill-per-token-s", "0.00002", "--api-key", SECRET, "--hf-token=" + SECRET, "--max-total-tokens=8"]
    assert redact(argv) == ["--prefill-per-token-s", "0.00002", "--api-key", REDACTED, "--hf-token=" + REDACTED,
                            "--max-total-tokens=8"]


def _engines(d: Path) -> None:
    """The engines' arguments as a proxy wrote them, with a secret an older proxy let through."""
    path = d / "engines.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for line in lines:
        if line.get("event") == "identity":
            line["server_args"] = {**SHOWN, "hf_token": SECRET, "nested": {"api_key": SECRET, "tp_size": 1}}
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_evidence_side_shows_timings_and_counts_and_hides_secrets(tmp_path: Path) -> None:
    d = write_records(tmp_path / "run")
    _engines(d)
    out = tmp_path / "llmd"
    assert evidence(["report", "--format", "llm-d", "--records", str(d), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["reports"]
    for entry in manifest["reports"]:
        text = (out / entry["path"]).read_text()
        assert SECRET not in text
        args = json.loads(text)["scenario"]["stack"][0]["native"]["args"]
        assert {k: args[k] for k in SHOWN} == SHOWN
        assert args["hf_token"] == args["nested"]["api_key"] == REDACTED
    summary = tmp_path / "summary"
    assert evidence(["summarize", "--records", str(d), "--out", str(summary)]) == 0
    doc = (summary / "summary.json").read_text()
    assert SECRET not in doc
    for engine in json.loads(doc)["engines"]:
        assert {k: engine["server_args"][k] for k in SHOWN} == SHOWN and engine["server_args"]["hf_token"] == REDACTED
