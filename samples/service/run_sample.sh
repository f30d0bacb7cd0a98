#!/bin/sh
# Runs the service sample as the README shows it: a loader, a trainer that crashes mid-run
# and is started again, and a second trainer; every batch must be trained on once the run
# ends. Usage: run_sample.sh <samples dir> <transport>
set -eu
dir=$1
transport=$2
address="unix:@ferry-sample-$$"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$dir/service_loader" --address "$address" --batches 30 --transport "$transport" > "$log" 2>&1 &
loader=$!
status=0
"$dir/service_trainer" --address "$address" --name a --crash-after 3 --step-ms 1 --transport "$transport" || status=$?
[ "$status" -eq 3 ] || { echo "the crashing trainer exited with $status, not 3"; exit 1; }
"$dir/service_trainer" --address "$address" --name b --steps 100 --step-ms 1 --transport "$transport" &
other=$!
"$dir/service_trainer" --address "$address" --name a --steps 100 --step-ms 1 --transport "$transport"
wait "$other"
wait "$loader"
cat "$log"
grep -Eq "trainer 0 (died|is gone)" "$log"  # seen at its next recv (PeerDied) or send (ChannelClosed)
grep -q "30 batches trained on" "$log"
