#!/bin/sh
# A Redis server: the primary if the sentinels say so (or if it is redis-0 and no
# sentinel answers yet), else a replica of the primary they name. AOF on: the job
# records and the queues live here.
set -eu
. /scripts/find-primary.sh
self="$(hostname).redis"
primary="$(find_primary)"
cat > /tmp/redis.conf <<CONF
port 6379
dir /data
appendonly yes
appendfsync everysec
requirepass $REDIS_PASSWORD
masterauth $REDIS_PASSWORD
replica-announce-ip $self
CONF
if [ "$primary" != "$self" ]; then
  echo "replicaof $primary 6379" >> /tmp/redis.conf
fi
exec redis-server /tmp/redis.conf
