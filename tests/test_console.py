"""The web console at /ui, in a real browser (Playwright driving Debian's Chromium) against
a real deployment (`kinds_dep`): ASR (tiny.en), TTS (Piper), image (a tiny diffusers
model) and LLM (a tiny model on the transformers engine) workers behind an API that
requires keys. The Talk page speaks to the Realtime API (`/v1/realtime`) through
Chromium's fake microphone.

Each test writes a screenshot of its page to `test-results/console/` (not committed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from harness.api_client import Api
from harness.audio import LONG, SHORT, encode, speech
from harness.batch_files import job_line, jsonl, upload
from harness.models.sd import TINY_SIZE
from harness.pool import DeploymentPool, Spec
from jobstore.api_keys import create_key
from jobstore.quotas import KeyLimits, set_limits
from tuning.deployment import REPO, Deployment

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium on PATH (apt-get install chromium): the console's browser tests "
    "drive a real browser",
)
SHOTS = Path(os.environ.get("MMQ_SCREENSHOTS", REPO / "test-results" / "console"))
WAIT_MS = 60_000

SENTENCES = " ".join(LONG[:8])


@pytest.fixture(scope="module")
def console_dep(kinds_dep: Deployment) -> Deployment:
    return kinds_dep


@pytest.fixture(scope="module")
def keys(console_dep: Deployment) -> dict[str, str]:
    client = redis.Redis.from_url(console_dep.redis_url, decode_responses=True)
    return {
        "admin": create_key(client, "console-admin", admin=True),
        "alice": create_key(client, "console-alice"),
        "bob": create_key(client, "console-bob"),
    }


@pytest.fixture(scope="module")
def driver() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@contextlib.contextmanager
def _chromium(driver: Playwright, microphone: Path) -> Iterator[Browser]:
    """Chromium whose microphone plays `microphone` (a WAV, looped) and is allowed."""
    chromium = driver.chromium.launch(
        executable_path=CHROMIUM,
        args=[
            "--no-sandbox",  # root in CI
            "--autoplay-policy=no-user-gesture-required",
            "--use-fake-ui-for-media-stream",  # the microphone is allowed
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={microphone}",
        ],
    )
    try:
        yield chromium
    finally:
        chromium.close()


@pytest.fixture(scope="module")
def browser(driver: Playwright, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    microphone = tmp_path_factory.mktemp("microphone") / "speech.wav"
    microphone.write_bytes(encode(*speech(SHORT), "wav"))  # the microphone says SHORT
    with _chromium(driver, microphone) as chromium:
        yield chromium


@contextlib.contextmanager
def _open_page(browser: Browser, dep: Deployment, name: str) -> Iterator[Page]:
    context = browser.new_context(base_url=dep.base_url, viewport={"width": 1366, "height": 860})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    context.close()
    assert not errors, errors  # no uncaught JavaScript error on any page


@pytest.fixture
def page(
    browser: Browser, console_dep: Deployment, request: pytest.FixtureRequest
) -> Iterator[Page]:
    with _open_page(browser, console_dep, request.node.name) as page:
        yield page


def _sign_in(page: Page, key: str, where: str = "#/jobs") -> None:
    page.goto(f"/ui{where}")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Open").click()
    page.get_by_text("forget key").wait_for()


def test_an_invalid_key_shows_an_error_and_a_good_one_opens_the_console(
    page: Page, keys: dict[str, str]
) -> None:
    page.goto("/ui")
    page.get_by_label("API key").fill("mmq_not-a-key")
    page.get_by_role("button", name="Open").click()
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert "unknown API key" in alert.inner_text()
    page.get_by_label("API key").fill(keys["admin"])
    page.get_by_role("button", name="Open").click()
    page.get_by_role("heading", name="Overview").wait_for()
    html = page.content()
    assert keys["admin"] not in html  # the console never shows a secret


def test_a_key_sees_its_own_jobs_only_and_no_overview(
    page: Page, console_dep: Deployment, keys: dict[str, str]
) -> None:
    alice, bob = Api(console_dep.base_url, keys["alice"]), Api(console_dep.base_url, keys["bob"])
    mine = alice.submit("tts", text="Mine.", format="pcm")["id"]
    theirs = bob.submit("tts", text="Theirs.", format="pcm")["id"]
    _sign_in(page, keys["alice"])
    page.get_by_role("link", name=mine).wait_for()
    assert page.get_by_role("link", name=theirs).count() == 0
    assert page.get_by_role("link", name="Overview").count() == 0
    page.goto("/ui#/overview")
    page.get_by_role("heading", name="Jobs").wait_for()


def test_the_overview_shows_the_workers_and_updates_when_a_job_runs(
    page: Page, console_dep: Deployment, keys: dict[str, str]
) -> None:
    _sign_in(page, keys["admin"], "#/overview")
    workers = page.locator("table.workers tbody tr")
    workers.first.wait_for()
    rows = workers.all_inner_texts()
    assert any("tts" in row for row in rows) and any("asr" in row for row in rows), rows
    models = page.locator("table.models tbody tr").all_inner_texts()
    assert any("tts" in row and "resident" in row for row in models), models
    card = page.locator('article[data-pipeline="tts"]')
    before = card.locator("dd.ended").inner_text()
    api = Api(console_dep.base_url, keys["admin"])
    job = api.submit("tts", text="The overview counts this job.", format="pcm")
    assert api.wait(job["id"])["status"] == "succeeded"
    page.wait_for_function(
        """([before]) => {
            const ended = document.querySelector('article[data-pipeline="tts"] dd.ended');
            return ended && ended.textContent !== before && ended.textContent.includes('succeeded');
        }""",
        arg=[before],
    )
    owner = api.http.get("/v1/whoami").json()["owner"]  # it submitted: its key is listed
    page.locator("table.keys tbody tr", has_text=owner).wait_for()
    r = redis.Redis.from_url(console_dep.redis_url, decode_responses=True)
    set_limits(r, owner, KeyLimits(max_running=7, costs={"tts": 90000}))
    row = page.locator("table.keys tbody tr", has_text=owner)
    row.filter(has_text="of 90000 characters").wait_for()  # its limits as they change
    assert "\t7\t" in row.inner_text()
    set_limits(r, owner, KeyLimits())


def test_the_tts_playground_plays_audio_before_the_job_ends(
    page: Page, keys: dict[str, str], console_dep: Deployment
) -> None:
    _sign_in(page, keys["admin"], "#/play/tts")
    page.get_by_label("Text").fill(SENTENCES)
    voice = page.get_by_label("Voice")  # the pipeline's voices (GET /v1/audio/voices)
    page.wait_for_function(
        "() => document.querySelectorAll('select[name=voice] option').length > 1"
    )
    assert voice.locator("option").all_inner_texts() == ["the default: joe", "joe"]
    voice.select_option(label="joe")
    page.get_by_role("button", name="Speak").click()
    page.wait_for_function(
        "() => { const a = document.querySelector('audio.sentence'); return a && a.duration > 0 }"
    )
    status = page.locator(".run .badge").inner_text()
    assert status == "running", status  # audio before the end
    page.locator(".run .badge.succeeded").wait_for()
    assert page.locator("audio.sentence").count() >= 7
    page.locator("audio.whole").wait_for()
    job_id = page.locator(".run [role=status] a").inner_text()
    job = Api(console_dep.base_url, keys["admin"]).get(job_id)
    assert (job["input"]["model"], job["input"]["voice"]) == ("tts", "joe"), job["input"]


def test_the_asr_playground_shows_segments_before_the_transcript(
    page: Page, keys: dict[str, str], tmp_path: Path
) -> None:
    samples, rate = speech(LONG)
    clip = tmp_path / "meeting.wav"
    clip.write_bytes(encode(samples, rate, "wav"))
    _sign_in(page, keys["admin"], "#/play/asr")
    page.get_by_label("Audio file").set_input_files(str(clip))
    page.get_by_role("button", name="Transcribe").click()
    page.locator(".transcript p time").first.wait_for()
    assert page.locator(".transcript p.final").count() == 0
    final = page.locator(".transcript p.final")
    final.wait_for()
    assert "budget" in final.inner_text().lower()


def test_the_asr_playground_transcribes_the_microphone(page: Page, keys: dict[str, str]) -> None:
    """Chromium's fake microphone plays a clip of speech; the page records it (WebM/Opus,
    MediaRecorder), uploads it and transcribes it."""
    _sign_in(page, keys["admin"], "#/play/asr")
    page.get_by_role("button", name="Record from the microphone").click()
    page.get_by_role("button", name="Stop and transcribe").wait_for()
    page.wait_for_timeout(6000)  # the clip is about five seconds
    page.get_by_role("button", name="Stop and transcribe").click()
    final = page.locator(".transcript p.final")
    final.wait_for()
    assert "fox" in final.inner_text().lower(), final.inner_text()


def test_the_image_playground_shows_steps_then_the_image(page: Page, keys: dict[str, str]) -> None:
    _sign_in(page, keys["admin"], "#/play/image")
    for name, value in (("steps", "12"), ("width", str(TINY_SIZE)), ("height", str(TINY_SIZE))):
        page.locator(f'input[name="{name}"]').fill(value)
    page.get_by_role("button", name="Draw").click()
    page.locator("progress.steps").wait_for()
    page.wait_for_function(
        "() => { const i = document.querySelector('img.result'); return i && i.naturalWidth > 0 }"
    )
    assert page.locator("img.result").evaluate("i => i.naturalWidth") == TINY_SIZE


def test_the_chat_streams_tokens(page: Page, keys: dict[str, str]) -> None:
    _sign_in(page, keys["admin"], "#/play/llm")
    page.get_by_label("Message").fill("Tell me a long story.")
    page.get_by_label("Max tokens").fill("200")
    page.get_by_role("button", name="Send").click()
    page.wait_for_function(
        "() => { const t = document.querySelector('.streaming .llm-text');"
        " return t && t.textContent.length > 1 }"
    )
    page.locator(".msg.assistant:not(.streaming)").wait_for()
    assert page.locator(".msg.assistant").inner_text().strip() != "assistant"


EMBEDDING = Spec.of(
    ("embed",),
    {"HF_HUB_OFFLINE": "1"},
    config='[pipelines.embed]\nkind = "embed"\nimpl = "pipelines.embed:EmbedPipeline"\n',
    reaper=False,
)
"""An API and a worker of the packaged embedding model, from the session's pool: the
session's deployment of every kind serves no `embed`."""


def test_the_embed_playground_shows_how_alike_the_texts_are(
    page: Page, pool: DeploymentPool
) -> None:
    embed = pool.get(EMBEDDING)
    key = create_key(redis.Redis.from_url(embed.redis_url), "console-embed", admin=True)
    page.goto(f"{embed.base_url}/ui#/play/embed")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Open").click()
    page.get_by_label("Texts, one a line").fill(
        "The cat sat on the mat.\nA kitten rests on a rug.\nStock prices fell sharply today."
    )
    page.get_by_role("button", name="Embed").click()
    page.locator("table.similarity").wait_for()
    rows = page.locator("table.similarity tbody tr")
    assert rows.count() == 3
    alike = [[float(c) for c in rows.nth(i).locator("td").all_inner_texts()] for i in range(3)]
    assert [alike[i][i] for i in range(3)] == [1.0, 1.0, 1.0]
    assert alike[0][1] > alike[0][2]  # the two cats, nearer than a cat and the markets


def test_cancel_works_from_the_job_page(
    page: Page, console_dep: Deployment, keys: dict[str, str]
) -> None:
    api = Api(console_dep.base_url, keys["admin"])
    job = api.submit("tts", text=" ".join(LONG * 3), format="pcm")
    _sign_in(page, keys["admin"], f"#/jobs/{job['id']}")
    page.get_by_role("heading", name=job["id"]).wait_for()
    page.locator("ol.timeline li.partial").first.wait_for()
    page.get_by_role("button", name="Cancel").click()
    page.locator("h1 .badge.canceled").wait_for()
    assert api.get(job["id"])["status"] == "canceled"
    facts = page.locator(".facts").first.inner_text()
    assert "worker tts-" in facts, facts


def test_the_batches_page_shows_a_batch_its_counts_and_its_lines_jobs(
    page: Page, console_dep: Deployment, keys: dict[str, str]
) -> None:
    alice = Api(console_dep.base_url, keys["alice"])
    source = upload(alice.http, jsonl([job_line(f"p{i}", "echo", text=f"p{i}") for i in range(3)]))
    batch = alice.http.post(
        "/v1/batches", json={"input_file_id": source, "endpoint": "/v1/jobs"}
    ).json()
    _sign_in(page, keys["alice"], "#/batches")
    page.get_by_role("link", name=batch["id"]).click()
    page.get_by_role("heading", name=f"Batch {batch['id']}").wait_for()
    page.get_by_text("3: 3 completed").wait_for()
    page.get_by_role("button", name="output file").wait_for()
    suffix = batch["id"].removeprefix("batch_")
    for line in (1, 2, 3):
        page.get_by_role("link", name=f"job_{suffix}_{line}").wait_for()
    with page.expect_download() as download:
        page.get_by_role("button", name="output file").click()
    saved = Path(download.value.path()).read_text().splitlines()
    assert sorted(json.loads(x)["custom_id"] for x in saved) == ["p0", "p1", "p2"]


def test_only_the_kinds_served_here_have_a_playground_and_the_lists_read_well(
    page: Page, console_dep: Deployment, keys: dict[str, str], tmp_path: Path
) -> None:
    """An API of the same deployment whose config serves echo and sleep only: no
    playground tab, and a playground asked for by its address says what to enable. On the
    full one: the jobs page filters by every kind, and the empty batches page reads as a
    sentence."""
    few = Deployment(console_dep.redis_url, tmp_path)  # the tests' echo and sleep alone
    try:
        few.start_api()
        page.goto(f"{few.base_url}/ui#/jobs")
        page.get_by_label("API key").fill(keys["bob"])
        page.get_by_role("button", name="Open").click()
        page.get_by_text("forget key").wait_for()
        page.get_by_role("heading", name="Jobs").wait_for()
        nav = page.get_by_role("navigation", name="Pages")
        for tab in ("Transcribe", "Speak", "Draw", "Chat"):
            assert nav.get_by_role("link", name=tab).count() == 0, tab
        page.goto(f"{few.base_url}/ui#/play/llm")
        page.get_by_text("No pipeline serves kind llm here").wait_for()
    finally:
        few.stop()
    _sign_in(page, keys["bob"], "#/jobs")
    options = page.get_by_label("Kind").locator("option").all_inner_texts()
    assert {"asr", "tts", "image", "llm", "embed", "noop"} <= set(options), options
    page.goto("/ui#/batches")
    page.get_by_text("No batches yet: create one with client.batches.create").wait_for()


# -- Talk: the Realtime API by voice ----------------------------------------------------

TALK_SENTENCE = SHORT[0]
TALK_WORDS = ("quick", "brown", "fox", "jumps", "lazy", "dog")
TALK_PAUSE_S = 8.0
"""Silence after the sentence: the server's VAD ends the turn in the first second of it,
and the rest leaves the CPU-only answer time to start playing before Chromium, which loops
the file, says the sentence again (and barges in)."""
TALK_MAX_TOKENS = 24
"""A short answer: the tiny LLM's gibberish seldom ends a sentence, so its audio is mostly
the rest spoken once the answer ends, which must come before the next turn cuts it off."""
TALK_WAIT_MS = 90_000


@pytest.fixture(scope="module")
def talk_browser(driver: Playwright, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    samples, rate = speech((TALK_SENTENCE,))
    pause = np.zeros(int(TALK_PAUSE_S * rate), dtype=np.int16)
    microphone = tmp_path_factory.mktemp("talk") / "turn.wav"
    microphone.write_bytes(encode(np.concatenate([samples, pause]), rate, "wav"))
    with _chromium(driver, microphone) as chromium:
        yield chromium


@pytest.fixture
def talk_page(
    talk_browser: Browser, console_dep: Deployment, request: pytest.FixtureRequest
) -> Iterator[Page]:
    with _open_page(talk_browser, console_dep, request.node.name) as page:
        yield page


@pytest.fixture
def talk_log(talk_page: Page) -> Iterator[list[str]]:
    """What the Talk page logs of its socket (each server event, audio by its size), timed;
    written beside the screenshots."""
    log: list[str] = []

    def keep(message: ConsoleMessage) -> None:
        if message.text.startswith("realtime"):
            log.append(f"{time.monotonic():.2f} {message.text}")

    talk_page.on("console", keep)
    yield log
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / "talk-events.txt").write_text("\n".join(log) + "\n")


def _turns(role: str) -> str:
    """JavaScript: the Talk page's turns of `role` (user, assistant), as an array."""
    return f"[...document.querySelectorAll('[data-testid=talk-turn][data-role={role}]')]"


def _assert_no_talk_errors(page: Page, log: list[str]) -> None:
    errors = page.get_by_test_id("talk-error").all_inner_texts()
    assert not errors, (errors, log)


def _wait_for(page: Page, what: str, condition: str, log: list[str]) -> None:
    """Waits for the JavaScript `condition` to hold, failing as soon as the page shows an
    error; on a timeout fails with the page's text and the events it got."""
    error_shown = "document.querySelector('[data-testid=talk-error]')"
    try:
        page.wait_for_function(f"() => {error_shown} || ({condition})", timeout=TALK_WAIT_MS)
    except PlaywrightTimeout:
        shown = page.locator("section.talk").inner_text()
        raise AssertionError(
            f"no {what} in {TALK_WAIT_MS} ms; page: {shown!r}; log: {log}"
        ) from None
    _assert_no_talk_errors(page, log)


def test_talk_converses_by_voice_and_stops(
    talk_page: Page, talk_log: list[str], keys: dict[str, str]
) -> None:
    """The microphone says a sentence and pauses; the server's VAD ends the turn; the page
    shows the sentence's transcript and the answer's, streaming, and plays the answer;
    Stop closes the socket."""
    page, log = talk_page, talk_log
    _sign_in(page, keys["admin"], "#/talk")
    page.get_by_role("navigation", name="Pages").get_by_role("link", name="Talk").wait_for()
    page.get_by_role("heading", name="Talk").wait_for()
    page.wait_for_function("() => document.querySelector('select[name=model] option')")
    page.get_by_label("Max output tokens").fill(str(TALK_MAX_TOKENS))
    page.get_by_role("button", name="Start").click()

    text = "t.querySelector('[data-testid=talk-text]').textContent"
    words = json.dumps(TALK_WORDS)
    heard = f"{_turns('user')}.some(t => {words}.some(w => {text}.toLowerCase().includes(w)))"
    _wait_for(page, "transcript of the sentence", heard, log)
    _wait_for(
        page, "transcript of an answer", f"{_turns('assistant')}.some(t => {text}.trim())", log
    )
    grows = f"{_turns('assistant')}.some(t => Number(t.dataset.deltas) >= 2 && {text}.trim())"
    _wait_for(page, "answer transcript in several deltas", grows, log)
    played = "Number(document.querySelector('[data-testid=talk-played]').dataset.seconds) > 0"
    _wait_for(page, "answer audio played", played, log)

    page.get_by_role("button", name="Stop").click()
    page.get_by_test_id("talk-status").filter(has_text="closed").wait_for()
    page.get_by_role("button", name="Start").wait_for()
    _assert_no_talk_errors(page, log)
    assert any("realtime closed: 1000" in line for line in log), log
