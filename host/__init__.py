"""Host orchestration: what runs on one machine (`mmq up`, `mmq workers`): device discovery,
placement, the supervisor that starts and restarts worker processes, the embedded Redis."""
