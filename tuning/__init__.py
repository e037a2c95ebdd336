"""`mmq tune`: measure a pipeline's knobs on this machine, with the user's traffic, under
latency SLOs, and say (or write) the best ones.

`slo` parses the objectives, `space` the knobs and their values, `workload` the jobs
and their arrival, `deploy` starts a private deployment and each candidate's workers,
`measure` drives one candidate through the load levels, `search` chooses which
candidates to measure, `report` prints, plots, saves and writes the result.

`deployment` (the one deployment builder) and `load` (the one load driver) are shared with
the tests and `bench/`.
"""
