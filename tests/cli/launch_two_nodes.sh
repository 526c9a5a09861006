#!/bin/sh
# Two `commgrid launch`es of 2 ranks each, as nodes 0 and 1 of one job over the loopback:
#   launch_two_nodes.sh COMMGRID PYTHON SCRIPT
# Passes when both exit 0 and rank 0 reports a world of 4.
set -u
cli=$1 python=$2 script=$3
# A port that is free now, and the one after it (torch's MASTER_PORT).
port=$("$python" -c 'import socket
for _ in range(50):
    a, b = socket.socket(), socket.socket()
    try:
        a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]; b.bind(("127.0.0.1", p + 1))
        print(p); break
    except OSError:
        pass
    finally:
        a.close(); b.close()')
out=$(mktemp) err1=$(mktemp)
trap 'rm -f "$out" "$err1"' EXIT
common="launch -n 2 --nnodes 2 --master-port $port --rdzv-id two-nodes-$$ --timeout 240"
COMMGRID_TOKEN=two-nodes "$cli" $common --node-rank 1 -- "$python" "$script" --tp 2 --pp 2 >/dev/null 2>"$err1" &
node1=$!
COMMGRID_TOKEN=two-nodes "$cli" $common --node-rank 0 --output rank0 -- "$python" "$script" --tp 2 --pp 2 >"$out"
rc0=$?
wait $node1
rc1=$?
cat "$out"; cat "$err1" >&2
echo "node 0 exited $rc0, node 1 exited $rc1 (commgrid store port $port, MASTER_PORT $((port + 1)))"
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] && grep -q "^megatron_init: world 4, tp 2, pp 2" "$out"
