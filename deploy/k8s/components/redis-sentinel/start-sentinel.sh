#!/bin/sh
# A Sentinel watching the primary (by host name: pods change address when they move).
set -eu
. /scripts/find-primary.sh
self="$(hostname).redis"
primary="$(find_primary)"
cat > /tmp/sentinel.conf <<CONF
port 26379
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $self
sentinel monitor mymaster $primary 6379 2
sentinel down-after-milliseconds mymaster 5000
sentinel failover-timeout mymaster 30000
sentinel parallel-syncs mymaster 1
sentinel auth-pass mymaster $REDIS_PASSWORD
CONF
exec redis-sentinel /tmp/sentinel.conf
