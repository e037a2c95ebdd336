"""Cluster daemons: processes that serve the whole deployment whichever host they run on
(the reaper and its sweeps, file retention, webhook delivery); several may run at once."""
