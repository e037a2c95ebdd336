"""What only the tests and benches use: the test pipelines, a client of one owner's key
(`api_client`), fault and network-namespace helpers, tiny models built from configs. Nothing
that ships imports it and the wheel does not hold it; the deployment builder, the load
driver and the SLO type they share with `mmq tune` are `tuning.deployment`, `tuning.load`
and `tuning.slo`."""
