#!/bin/sh
# Print the host name of the primary that the sentinels agree on; redis-0's when none
# answers (the first start of the StatefulSet). Sourced by the two start scripts.
find_primary() {
  for peer in redis-0 redis-1 redis-2; do
    found=$(timeout 3 redis-cli -h "$peer.redis" -p 26379 --raw \
      sentinel get-master-addr-by-name mymaster 2>/dev/null | head -n 1)
    if [ -n "$found" ]; then
      echo "$found"
      return
    fi
  done
  echo "redis-0.redis"
}
