"""Running real deployments outside production: the deployment builder (`deploy`), the
load driver (`load`) and the SLO type (`slo`) that the tests, `bench/` and `mmq tune` share,
and what only the tests and benches use (test pipelines, fault and network-namespace
helpers, tiny models built from configs)."""
