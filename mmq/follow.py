"""`mmq submit --follow`: print a job's events as they arrive, progress as a bar."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from mmq.client import Client


def follow_job(client: Client, job_id: str, console: Console) -> dict[str, Any]:
    """Print every event of the job until it ends; returns the ended job."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    bar: TaskID | None = None
    with progress:
        for event in client.events(job_id):
            etype, data = event["type"], event["data"]
            if etype == "progress":
                if bar is None:
                    bar = progress.add_task("progress", total=data.get("total"))
                progress.update(bar, completed=data.get("step", 0), total=data.get("total"))
            elif etype == "status":
                console.print(f"[bold]status[/] {data['status']}")
            elif etype == "partial":
                console.print(f"[cyan]partial[/] {json.dumps(data)[:200]}")
            elif etype == "error":
                console.print(f"[red]error[/] {data.get('message', data)}")
    return client.get(job_id)
