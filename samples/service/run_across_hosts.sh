#!/bin/sh
# Runs the service sample across two "hosts": two network namespaces joined by a veth pair,
# the loader in one listening at ucx://10.77.0.1:PORT, two trainers in the other. Needs root
# and ip(8), and the sample built with ferry::ucx; exits 77 (skipped) otherwise. Everything it
# creates is removed when it ends, also on failure. Usage: run_across_hosts.sh <samples dir>
set -eu
dir=$1
[ "$(id -u)" -eq 0 ] || { echo "skipped: creating network namespaces needs root"; exit 77; }
command -v ip > /dev/null || { echo "skipped: ip(8) is missing (apt-get install iproute2)"; exit 77; }
ldd "$dir/service_loader" | grep -q libucp || { echo "skipped: the sample was built without ferry::ucx"; exit 77; }
tag="fy$$"
loader_ns="$tag-loader"
trainer_ns="$tag-trainer"
log=$(mktemp)
cleanup() {
  ip netns pids "$loader_ns" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
  ip netns pids "$trainer_ns" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
  ip netns del "$loader_ns" 2> /dev/null || true
  ip netns del "$trainer_ns" 2> /dev/null || true
  rm -f "$log"
}
trap cleanup EXIT
ip netns add "$loader_ns" || { echo "skipped: ip netns add failed (no network namespaces here)"; exit 77; }
ip netns add "$trainer_ns"
ip link add "$tag-a" netns "$loader_ns" type veth peer name "$tag-b" netns "$trainer_ns"
ip -n "$loader_ns" addr add 10.77.0.1/24 dev "$tag-a"
ip -n "$trainer_ns" addr add 10.77.0.2/24 dev "$tag-b"
for ns in "$loader_ns" "$trainer_ns"; do
  ip -n "$ns" link set lo up
done
ip -n "$loader_ns" link set "$tag-a" up
ip -n "$trainer_ns" link set "$tag-b" up
# UCX uses only the devices that are up when it starts: wait for the pair's carrier.
tries=0
until ip -n "$loader_ns" link show "$tag-a" | grep -q 'state UP' && ip -n "$trainer_ns" link show "$tag-b" | grep -q 'state UP'; do
  tries=$((tries + 1))
  [ "$tries" -lt 500 ] || { echo "the veth pair did not come up"; exit 1; }
  sleep 0.01
done

export FERRY_SECRET="sample-$(cat /proc/sys/kernel/random/uuid)"  # both sides prove it; without one both refuse
export UCX_TLS=tcp
address="ucx://10.77.0.1:7407"
# The batches outlast both trainers' connects (each derives the key, about 0.2 s, first).
ip netns exec "$loader_ns" "$dir/service_loader" --address "$address" --batches 100 > "$log" 2>&1 &
loader=$!
ip netns exec "$trainer_ns" "$dir/service_trainer" --address "$address" --name b --steps 100 --step-ms 5 &
other=$!
ip netns exec "$trainer_ns" "$dir/service_trainer" --address "$address" --name a --steps 100 --step-ms 5 || { cat "$log"; exit 1; }
wait "$other"
wait "$loader"
cat "$log"
grep -q "100 batches trained on" "$log"
