"""How a batch line's ended job reads in the batch's output file: the answer its
endpoint's route gives (`api.openai.answers`, or the job's view for `/v1/jobs`). The
scheduler's batch feed is handed this (`mmq scheduler`); it imports nothing of the API."""

from __future__ import annotations

from api.openai import answers
from api.views import job_view
from jobs.models import Job
from jobstore.batch_records import Batch, Line


class RouteAnswers:
    """`scheduler.batch_feed.LineAnswers`, as the routes answer."""

    def __init__(self, public_url: str) -> None:
        self.public_url = public_url

    def answer(self, batch: Batch, line: Line, job: Job) -> dict[str, object]:
        model = str(line.answer.get("model", job.pipeline))
        if batch.endpoint == "/v1/chat/completions":
            return answers.completion(job, model, chat=True)
        if batch.endpoint == "/v1/completions":
            return answers.completion(job, model, chat=False)
        if batch.endpoint == "/v1/embeddings":
            return answers.embeddings(job, model, str(line.answer.get("encoding_format")))
        return job_view(job, self.public_url).model_dump(mode="json")

    def failure(self, batch: Batch, job: Job) -> tuple[int, dict[str, object]]:
        error = job.error.model_dump() if job.error is not None else None
        code = answers.failure_status(str(job.status), error)
        if batch.endpoint == "/v1/jobs":
            return code, job_view(job, self.public_url).model_dump(mode="json")
        return code, answers.failure_body(str(job.status), error, {})
