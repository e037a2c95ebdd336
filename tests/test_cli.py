"""The `mmq` commands against a real Redis: `keys`, and a created key used on the API;
`submit` with `--follow`, `--output` and `--json` against workers of every built-in kind
(tiny models)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import wave
from pathlib import Path

import httpx
import pytest
import redis
from PIL import Image
from rich.console import Console
from rich.control import strip_control_codes

from common.procs import free_port
from harness.audio import spoken
from harness.models.sd import TINY_SIZE
from jobs import keys
from jobstore.api_keys import create_key, hash_key
from mmq.follow import RENDERERS
from mmq.output_file import result_bytes
from tuning.deployment import REPO, Deployment, wait_until


@pytest.fixture(scope="module")
def deployment(kinds_dep: Deployment) -> Deployment:
    """conftest's deployment (API, reaper, echo and sleep workers) with a worker of each
    built-in kind on its tiny model: the session's `kinds_dep`, on its own Redis."""
    return kinds_dep


@pytest.fixture
def rclient(kinds_dep: Deployment) -> redis.Redis:
    return redis.Redis.from_url(kinds_dep.redis_url, decode_responses=True)


def _mmq(*args: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MMQ_REDIS_URL": redis_url, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "mmq.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_keys_create_prints_a_key_that_is_stored_only_as_a_hash(
    deployment: Deployment, rclient: redis.Redis
) -> None:
    created = _mmq("keys", "create", "carol", redis_url=deployment.redis_url)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("mmq_")
    stored = rclient.hgetall(keys.API_KEYS)
    assert key not in stored and all(key not in v for v in stored.values())
    r = httpx.get(f"{deployment.base_url}/v1/jobs", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200
    overview = f"{deployment.base_url}/v1/admin/overview"
    r = httpx.get(overview, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 403, r.text  # not an admin key
    made = _mmq("keys", "create", "root", "--admin", redis_url=deployment.redis_url)
    admin = made.stdout.strip().splitlines()[-1]
    r = httpx.get(overview, headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200, r.text

    revoked = _mmq("keys", "revoke", "carol", redis_url=deployment.redis_url)
    assert revoked.returncode == 0 and "revoked 1" in revoked.stdout
    r = httpx.get(f"{deployment.base_url}/v1/jobs", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 401

    bad = _mmq("keys", "create", "no spaces allowed", redis_url=deployment.redis_url)
    assert bad.returncode != 0


def test_keys_list_shows_ids_never_keys_and_revoke_takes_one_by_its_id(
    deployment: Deployment,
) -> None:
    made = [_mmq("keys", "create", "dana", redis_url=deployment.redis_url) for _ in range(2)]
    first, second = (m.stdout.strip().splitlines()[-1] for m in made)
    listed = _mmq("keys", "list", redis_url=deployment.redis_url)
    assert listed.returncode == 0, listed.stderr
    danas = [line for line in listed.stdout.splitlines() if " dana " in line]
    assert len(danas) == 2 and first not in listed.stdout and second not in listed.stdout
    first_id = next(
        line.split()[0] for line in danas if hash_key(first).startswith(line.split()[0])
    )
    gone = _mmq("keys", "revoke", "--id", first_id, redis_url=deployment.redis_url)
    assert gone.returncode == 0 and f"revoked key {first_id} of dana" in gone.stdout
    whoami = f"{deployment.base_url}/v1/whoami"
    assert httpx.get(whoami, headers={"Authorization": f"Bearer {first}"}).status_code == 401
    assert httpx.get(whoami, headers={"Authorization": f"Bearer {second}"}).status_code == 200
    nothing = _mmq("keys", "revoke", "--id", first_id, redis_url=deployment.redis_url)
    assert nothing.returncode == 2 and "no one key has the id" in nothing.stderr
    version = _mmq("--version", redis_url=deployment.redis_url)
    assert re.fullmatch(r"mmq \d+\.\d+\.\d+\n", version.stdout), version.stdout


def test_submit_to_an_api_that_does_not_answer_says_so_in_two_lines(
    deployment: Deployment, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = _mmq("submit", "noop", "--url", url, redis_url=deployment.redis_url)
    assert done.returncode == 2
    assert f"cannot reach the API at {url}" in done.stdout and "Traceback" not in done.stdout
    assert len(done.stdout.strip().splitlines()) <= 3, done.stdout


def test_submit_says_when_a_file_is_missing_or_the_api_wants_a_key(
    deployment: Deployment, tmp_path: Path
) -> None:
    base = ("submit", "--url", deployment.base_url)
    missing = _mmq(*base, "asr", "--set", "audio=./nofile.wav", redis_url=deployment.redis_url)
    assert missing.returncode == 2
    assert "--set audio=./nofile.wav: the file does not exist" in missing.stderr, missing.stderr
    refused = _mmq(*base, "noop", "--key", "mmq_not_a_key", redis_url=deployment.redis_url)
    assert refused.returncode == 2 and refused.stdout.startswith("401 "), refused.stdout
    assert "--key" in refused.stdout and "MMQ_API_KEY" in refused.stdout
    assert "Traceback" not in refused.stdout + refused.stderr


def test_keys_limits_sets_a_keys_limits_that_the_api_applies(deployment: Deployment) -> None:
    key = _mmq("keys", "create", "erin", redis_url=deployment.redis_url).stdout.split()[-1]
    set_ = _mmq("keys", "limits", "erin", "--max-queued", "1", "--weight", "2",
                redis_url=deployment.redis_url)  # fmt: skip
    assert set_.returncode == 0, set_.stderr
    shown = json.loads(set_.stdout.strip().splitlines()[-1])
    assert shown["max_queued"] == 1 and shown["weight"] == 2 and shown["requests"] == 0
    headers = {"Authorization": f"Bearer {key}"}
    body = {"kind": "sleep", "input": {"steps": 40, "step_ms": 50}}
    answers = [httpx.post(f"{deployment.base_url}/v1/jobs", json=body, headers=headers)
               for _ in range(3)]  # fmt: skip
    assert 429 in [a.status_code for a in answers]  # one may run, one waits, one is refused
    me = httpx.get(f"{deployment.base_url}/v1/whoami", headers=headers).json()
    assert me["quota"]["max_queued"] == 1
    more = _mmq("keys", "limits", "erin", "--max-running", "3", "--cost", "llm=5000",
                "--cost", "asr=60", redis_url=deployment.redis_url)  # fmt: skip
    assert more.returncode == 0, more.stderr
    shown = json.loads(more.stdout.strip().splitlines()[-1])
    assert shown["max_queued"] == 1 and shown["max_running"] == 3  # the others kept
    assert shown["costs"]["llm"] == {"unit": "tokens", "limit": 5000, "used": 0}
    assert shown["costs"]["asr"]["limit"] == 60
    bad = _mmq("keys", "limits", "erin", "--cost", "sleep=5", redis_url=deployment.redis_url)
    assert bad.returncode == 2 and "'sleep' has no cost quota" in bad.stderr
    cleared = _mmq("keys", "limits", "erin", "--clear", redis_url=deployment.redis_url)
    assert json.loads(cleared.stdout.strip().splitlines()[-1])["max_queued"] == 0
    for answer in answers:
        if answer.status_code == 202:
            httpx.post(
                f"{deployment.base_url}/v1/jobs/{answer.json()['id']}/cancel", headers=headers
            )


def test_keys_without_a_redis_url_or_a_running_up_say_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMQ_")}
    env |= {"MMQ_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO)}
    made = subprocess.run(
        [sys.executable, "-m", "mmq.cli", "keys", "create", "dave"], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 2
    assert "no `mmq up` runs with data dir" in made.stderr and made.stdout == ""


def test_submit_follow_prints_events_and_exit_code_tells_the_end(
    deployment: Deployment, rclient: redis.Redis
) -> None:
    from jobstore.api_keys import create_key

    key = create_key(rclient, "follower")
    env = {"url": deployment.base_url, "key": key}
    ok = _mmq(
        "submit", "sleep", "--set", "steps=3", "--set", "step_ms=50", "--follow",
        "--url", env["url"], "--key", env["key"], redis_url=deployment.redis_url,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "status running" in ok.stdout and "status succeeded" in ok.stdout
    assert '"steps": 3' in ok.stdout

    failed = _mmq(
        "submit", "echo", "-i", '{"text": "x", "fail": true, "group": "cli"}', "--follow",
        "--url", env["url"], "--key", env["key"], redis_url=deployment.redis_url,
    )  # fmt: skip
    assert failed.returncode == 1
    assert (
        "status failed" in failed.stdout
        and "error pipeline_error: RuntimeError: boom" in failed.stdout
    )

    bad = _mmq(
        "submit", "echo", "--set", "colour=red", "--url", env["url"], "--key", env["key"],
        redis_url=deployment.redis_url,
    )  # fmt: skip
    assert bad.returncode == 2 and "422 invalid_input: input." in bad.stdout


def test_a_joining_host_refuses_unshared_local_storage(redis_url: str) -> None:
    """`mmq workers` on another host: outputs it writes must be readable by the API."""
    done = _mmq("workers", "--redis", redis_url, redis_url="")
    assert done.returncode == 2
    assert "storage.local_shared" in done.stderr and '"s3"' in done.stderr, done.stderr


def test_a_worker_joins_with_redis_and_host_name_options(deployment: Deployment) -> None:
    """`--redis` and `--host-name` on the command line: the worker's id and its liveness
    record carry the host name (namespaced or containerised hosts share system names)."""
    r = redis.Redis.from_url(deployment.redis_url, decode_responses=True)
    worker = deployment.spawn(
        "worker-box7", "worker", "--pipeline", "echo", "--redis", deployment.redis_url,
        "--host-name", "box-7", env={"MMQ_REDIS_URL": ""},
    )  # fmt: skip
    try:

        def registered() -> list[str]:
            return [n for n in r.zrange(keys.WORKERS, 0, -1) if "@box-7." in n]

        wait_until(lambda: bool(registered()), worker, timeout_s=30)
        (name,) = registered()
        assert name.startswith("echo-0@box-7.")
        assert r.hget(keys.worker(name), "host") == "box-7"
    finally:
        worker.stop()


def _submit(dep: Deployment, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`mmq submit ARGS` against the deployment's API, as owner `key`."""
    done = _mmq("submit", *args, "--url", dep.base_url, "--key", key, redis_url=dep.redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _job(dep: Deployment, key: str, stdout: str) -> dict[str, object]:
    """The job whose id `mmq submit` printed first."""
    job_id = stdout.split()[1]
    r = httpx.get(f"{dep.base_url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"})
    return dict(r.json())


@pytest.fixture
def key(rclient: redis.Redis, request: pytest.FixtureRequest) -> str:
    return create_key(rclient, re.sub(r"[^a-z]", "", request.node.name)[-40:])


def test_follow_reads_tts_sentences_with_their_length_and_output_writes_the_wav(
    deployment: Deployment, key: str, tmp_path: Path
) -> None:
    out = tmp_path / "speech.wav"
    text = "Hello there. How are you today?"
    done = _submit(deployment, key, "tts", "--set", f"text={text}", "--follow", "-o", str(out))
    lines = re.findall(r"^sentence (\d+): (.*) \((\d+\.\d) s of audio\)$", done.stdout, re.M)
    assert [(n, t) for n, t, _ in lines if t != "…"] == [
        ("1", "Hello there."),
        ("2", "How are you today?"),
    ]
    assert max(len(line) for line in done.stdout.splitlines()) < 200  # no base64 audio
    with wave.open(str(out)) as audio:
        seconds = audio.getnframes() / audio.getframerate()
    assert seconds > 1.0 and abs(seconds - sum(float(s) for *_, s in lines)) < 0.1 * len(lines)
    assert f"wrote {out}" in done.stdout


def test_follow_reads_asr_segments_with_their_times_and_output_writes_the_text(
    deployment: Deployment, key: str, tmp_path: Path
) -> None:
    local = tmp_path / "speech.wav"  # a file here: `--set` uploads it, the job names its key
    local.write_bytes(spoken())
    out = tmp_path / "transcript.txt"
    done = _submit(deployment, key, "asr", "--set", f"audio={local}", "--follow", "-o", str(out))
    job = _job(deployment, key, done.stdout)
    audio = str(job["input"]["audio"])
    assert "/uploads/" in audio and audio.endswith("/speech.wav") and not audio.startswith("/")
    output = job["output"]
    assert isinstance(output, dict) and "quick brown fox" in output["text"].lower()
    for segment in output["segments"]:
        times = f"[{segment['start']:7.2f} → {segment['end']:7.2f}] {segment['text'].strip()}"
        assert times in done.stdout.splitlines()
    assert out.read_text() == output["text"] + "\n"


def test_follow_prints_llm_tokens_inline_and_output_writes_the_text(
    deployment: Deployment, key: str, tmp_path: Path
) -> None:
    out = tmp_path / "answer.txt"
    inp = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "cache": False}
    done = _submit(deployment, key, "llm", "-i", json.dumps(inp), "--follow", "-o", str(out))
    output = _job(deployment, key, done.stdout)["output"]
    assert isinstance(output, dict) and output["text"]
    assert "partial" not in done.stdout
    assert f"\n{strip_control_codes(output['text'])}\n" in done.stdout
    assert out.read_text() == output["text"].rstrip("\n") + "\n"


def test_output_waits_for_an_image_and_writes_the_png(
    deployment: Deployment, key: str, tmp_path: Path
) -> None:
    out = tmp_path / "image.png"
    inp = {"prompt": "a red box", "width": TINY_SIZE, "height": TINY_SIZE, "steps": 2}
    done = _submit(deployment, key, "image", "-i", json.dumps(inp), "--output", str(out))
    assert f"wrote {out}" in done.stdout
    with Image.open(io.BytesIO(out.read_bytes())) as image:
        assert image.format == "PNG" and image.size == (TINY_SIZE, TINY_SIZE)


def test_json_prints_the_raw_events_one_object_a_line(
    deployment: Deployment, key: str, tmp_path: Path
) -> None:
    out = tmp_path / "output.json"
    done = _submit(
        deployment, key, "echo", "--set", "text=hi", "--follow", "--json", "-o", str(out)
    )
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["type"] for e in events][-3:] == ["partial", "output", "status"]
    partial = next(e for e in events if e["type"] == "partial")
    assert partial["data"] == {"text": "h"} and events[-1]["data"]["status"] == "succeeded"
    assert json.loads(out.read_text())["text"] == "hi"
    assert f"wrote {out}" in done.stderr


def test_an_llm_answer_with_tool_calls_reads_as_calls_and_is_written_as_json(
    tmp_path: Path,
) -> None:
    """`mmq follow` shows a tool call (an answer with no text), and `--output` writes such
    an answer whole as JSON: the calls are not plain text."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    output = {"text": "", "finish_reason": "tool_calls", "tool_calls": [call]}
    console = Console(file=io.StringIO(), width=120)
    RENDERERS["llm"].output(console, output, 0)
    assert 'tool call f({"a": 1})' in console.file.getvalue()  # type: ignore[attr-defined]
    job = {"kind": "llm", "output": output}
    written = result_bytes(None, job, tmp_path / "answer.txt")  # type: ignore[arg-type]
    assert json.loads(written) == output
    plain = result_bytes(None, {"kind": "llm", "output": {"text": "hi"}}, tmp_path / "a.txt")  # type: ignore[arg-type]
    assert plain == b"hi\n"
