#!/usr/bin/env bash
# run-cluster.sh starts a local Shale cluster of three nodes on 127.0.0.1 and
# keeps it running until Ctrl-C (SIGINT) or SIGTERM, which stops every node
# cleanly. `make run` builds the binaries and runs it.
#
# Node i (i = 1, 2, 3) listens for gRPC on 127.0.0.1:700i and serves
# /metrics, /debug/pprof and /healthz on 127.0.0.1:800i; its data is in
# ./data/nodei and its log in ./data/nodei.log. A second run finds the data
# and restarts the same cluster from it (the --initial-cluster and
# --initial-splits flags only matter the first time, when a node has no data).
#
# Environment (defaults in brackets; relative paths are relative to the
# current directory):
#   SHALE_BIN_DIR         directory with shale-server and shalectl [<repo>/bin]
#   SHALE_DATA_DIR        data and logs                             [<repo>/data]
#   SHALE_HOST            address the nodes listen on               [127.0.0.1]
#   SHALE_PORTS           gRPC ports, one per node (their number is
#                         the number of nodes)                      [7001,7002,7003]
#   SHALE_HTTP_PORTS      HTTP ports, one per node                  [8001,8002,8003]
#   SHALE_INITIAL_SPLITS  split keys of a new cluster               [g,n,t]
#   SHALE_READY_TIMEOUT   seconds to wait for the cluster to answer [60]
#   SHALE_STOP_TIMEOUT    seconds to wait for the nodes to stop before
#                         SIGKILL                                   [20]
#   SHALE_TLS             1: mutual TLS between the nodes and for the
#                         clients (and HTTPS on the HTTP ports)     [0: off]
#
# With SHALE_TLS=1 the certificates are in DATA_DIR/certs: ca.crt and ca.key,
# the CA (made with `shalectl cert create-ca` when ca.crt is missing, which
# also makes every other certificate again); nodeI.crt and nodeI.key, node
# I's certificate for localhost, 127.0.0.1 and SHALE_HOST, used for clients
# and peers alike; client.crt and client.key, the client certificate of the
# user root. Missing ones are made on each run; existing ones are kept.
# Clients then need `shalectl --cacert DATA_DIR/certs/ca.crt --cert
# DATA_DIR/certs/client.crt --key DATA_DIR/certs/client.key ...` (the script
# prints the command). Without SHALE_TLS the cluster is plaintext, whatever
# certificates DATA_DIR holds.
# The servers also read their other flags from SHALE_<FLAG> variables (for
# example SHALE_LOG_LEVEL=debug); see `shale-server --help`.
#
# Exit status: 0 after Ctrl-C/SIGTERM when every node stopped cleanly; 1 when
# the cluster could not start, a node had to be killed or exited with an
# error, or every node exited on its own.
#
# While it runs, another terminal can stop, start or restart one node of it
# (the running script does it, and keeps supervising the node):
#   scripts/run-cluster.sh restart|stop|start N
# with the same SHALE_DATA_DIR (the running script's pid is in
# DATA_DIR/run-cluster.pid). Exit status 0 when done, 1 otherwise.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin_dir="${SHALE_BIN_DIR:-$root/bin}"
data_dir="${SHALE_DATA_DIR:-$root/data}"
host="${SHALE_HOST:-127.0.0.1}"
ports_csv="${SHALE_PORTS:-7001,7002,7003}"
http_csv="${SHALE_HTTP_PORTS:-8001,8002,8003}"
splits="${SHALE_INITIAL_SPLITS-g,n,t}"
ready_timeout="${SHALE_READY_TIMEOUT:-60}"
stop_timeout="${SHALE_STOP_TIMEOUT:-20}"
tls="${SHALE_TLS:-0}"

prog="run-cluster"
say() { printf '%s: %s\n' "$prog" "$*"; }
err() { printf '%s: error: %s\n' "$prog" "$*" >&2; }

# pretty prints a path relative to the current directory when it is below it.
pretty() {
	case "$1" in
	"$PWD"/*) printf './%s' "${1#"$PWD"/}" ;;
	*) printf '%s' "$1" ;;
	esac
}

pidfile="$data_dir/run-cluster.pid"
request="$data_dir/run-cluster.request"
reply="$data_dir/run-cluster.reply"

# control sends a request (restart|stop|start N) to the running script and
# prints its reply.
control() {
	local what="$1" node="${2:-}" pid waited=0
	case "$node" in
	'' | *[!0-9]* | 0)
		err "usage: $0 $what N (N: the node's number, 1 to the cluster's size)"
		exit 1
		;;
	esac
	# The pid file of a script killed outright stays behind: check that
	# its pid is still this script, not a process that reused the number.
	if [ ! -e "$pidfile" ] || ! pid="$(cat "$pidfile")" || ! kill -0 "$pid" 2>/dev/null ||
		! ps -p "$pid" -o args= 2>/dev/null | grep -q 'run-cluster'; then
		err "no cluster of this script is running with its data in $(pretty "$data_dir") (start one with 'make run')"
		exit 1
	fi
	rm -f "$reply"
	printf '%s %s\n' "$what" "$node" >"$request.tmp"
	mv "$request.tmp" "$request"
	kill -USR1 "$pid"
	# Stopping waits up to SHALE_STOP_TIMEOUT, starting up to
	# SHALE_READY_TIMEOUT; allow both.
	while [ ! -e "$reply" ]; do
		if ! kill -0 "$pid" 2>/dev/null; then
			err "the running script (pid $pid) exited before it answered"
			exit 1
		fi
		if [ "$waited" -ge $(((stop_timeout + ready_timeout + 5) * 10)) ]; then
			err "no answer from the running script (pid $pid)"
			exit 1
		fi
		sleep 0.1
		waited=$((waited + 1))
	done
	local st=0
	sed -n '2,$p' "$reply"
	read -r st <"$reply" || true
	rm -f "$reply"
	exit "$st"
}
case "${1:-}" in
restart | stop | start) control "$@" ;;
'') ;;
*)
	err "unknown command '$1' (usage: $0 [restart|stop|start N])"
	exit 1
	;;
esac

IFS=, read -r -a ports <<<"$ports_csv"
IFS=, read -r -a http_ports <<<"$http_csv"
n=${#ports[@]}
if [ "$n" -eq 0 ] || [ "${#http_ports[@]}" -ne "$n" ]; then
	err "SHALE_PORTS ($ports_csv) and SHALE_HTTP_PORTS ($http_csv) must list the same number of ports"
	exit 1
fi
for p in "${ports[@]}" "${http_ports[@]}"; do
	case "$p" in
	'' | *[!0-9]*)
		err "bad port '$p' in SHALE_PORTS/SHALE_HTTP_PORTS"
		exit 1
		;;
	esac
done
for v in "$ready_timeout" "$stop_timeout"; do
	case "$v" in
	'' | *[!0-9]*)
		err "SHALE_READY_TIMEOUT and SHALE_STOP_TIMEOUT are whole seconds, got '$v'"
		exit 1
		;;
	esac
done

case "$tls" in
0 | 1) ;;
*)
	err "SHALE_TLS is 1 (TLS on) or 0 (off), got '$tls'"
	exit 1
	;;
esac

server="$bin_dir/shale-server"
ctl="$bin_dir/shalectl"
for b in "$server" "$ctl"; do
	if [ ! -x "$b" ]; then
		err "$(pretty "$b") is missing; build it with 'make build' (or set SHALE_BIN_DIR)"
		exit 1
	fi
done

endpoints=""
initial_cluster=""
for ((i = 1; i <= n; i++)); do
	endpoints+="${endpoints:+,}$host:${ports[i - 1]}"
	initial_cluster+="${initial_cluster:+,}$i=$host:${ports[i - 1]}"
done

# Refuse to start on busy ports: something (often a cluster started before)
# already listens there.
busy=""
for p in "${ports[@]}" "${http_ports[@]}"; do
	if (exec 3<>"/dev/tcp/$host/$p") 2>/dev/null; then
		busy+=" $p"
	fi
done
if [ -n "$busy" ]; then
	err "port(s)$busy on $host already in use: is a cluster already running (another 'make run')?"
	if [ -e "$pidfile" ] && kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null; then
		err "one is (pid $(cat "$pidfile")): to restart one of its nodes, run '$0 restart N'"
	fi
	err "find what listens there with 'ss -ltnp' (or 'lsof -i :PORT'), or pick other ports with SHALE_PORTS and SHALE_HTTP_PORTS"
	exit 1
fi

# Existing data: every node must have it, or none (a node started without
# data next to nodes with data would bootstrap a conflicting cluster).
have=0
for ((i = 1; i <= n; i++)); do
	if [ -e "$data_dir/node$i/NODE" ]; then
		have=$((have + 1))
	fi
done
if [ "$have" -ne 0 ] && [ "$have" -ne "$n" ]; then
	err "$(pretty "$data_dir") holds data for $have of the $n nodes; remove it to start a new cluster (make clean)"
	exit 1
fi
mkdir -p "$data_dir"
if [ "$have" -eq "$n" ]; then
	say "reusing the data in $(pretty "$data_dir"): restarting the existing cluster"
else
	say "starting a new $n-node cluster in $(pretty "$data_dir") (initial splits: ${splits:-none})"
fi

# cert runs `shalectl cert ...`, showing its output only when it fails.
cert() {
	local out
	if ! out="$("$ctl" cert "$@" 2>&1)"; then
		err "shalectl cert $* failed:"
		printf '%s\n' "$out" >&2
		exit 1
	fi
}

# With TLS, make the certificates that are missing: all of them with a new
# CA (those of an old one would not verify).
certs="$data_dir/certs"
ctl_tls=() # shalectl's TLS flags
if [ "$tls" -eq 1 ]; then
	made=()
	new_ca=0
	if [ ! -e "$certs/ca.crt" ]; then
		cert create-ca --certs-dir "$certs" --overwrite
		made+=(ca)
		new_ca=1
	fi
	for ((i = 1; i <= n; i++)); do
		if [ "$new_ca" -eq 1 ] || [ ! -e "$certs/node$i.crt" ] || [ ! -e "$certs/node$i.key" ]; then
			cert create-node "node$i" localhost 127.0.0.1 "$host" --certs-dir "$certs" --overwrite
			made+=("node$i")
		fi
	done
	if [ "$new_ca" -eq 1 ] || [ ! -e "$certs/client.crt" ] || [ ! -e "$certs/client.key" ]; then
		cert create-client root --certs-dir "$certs" --overwrite
		made+=(client)
	fi
	if [ "${#made[@]}" -gt 0 ]; then
		say "TLS: made the certificates ${made[*]} in $(pretty "$certs")"
	else
		say "TLS: using the certificates in $(pretty "$certs")"
	fi
	ctl_tls=(--cacert "$certs/ca.crt" --cert "$certs/client.crt" --key "$certs/client.key")
fi

pids=()
reaped=() # 1 for a node whose exit status was already collected
held=()   # 1 for a node stopped on request (scripts/run-cluster.sh stop N)
stopping=0
force=0

alive() { kill -0 "$1" 2>/dev/null; }

# nap sleeps in the background so that a signal interrupts the wait at once;
# the sleep is killed and reaped when the wait ends early (see also
# kill_sleeper) so that nothing outlives the script.
sleeper=""
nap() {
	sleep "$1" &
	sleeper=$!
	wait "$sleeper" || true
	kill_sleeper
}
kill_sleeper() {
	if [ -n "$sleeper" ]; then
		kill "$sleeper" 2>/dev/null || true
		wait "$sleeper" 2>/dev/null || true
		sleeper=""
	fi
}

# tail_logs prints the end of every node's log to stderr.
tail_logs() {
	for ((i = 1; i <= n; i++)); do
		printf -- '--- last lines of %s ---\n' "$(pretty "$data_dir/node$i.log")" >&2
		tail -n "${1:-15}" "$data_dir/node$i.log" >&2 2>/dev/null || true
	done
}

# stop_nodes sends SIGTERM to the running nodes, waits up to $stop_timeout
# seconds (a second Ctrl-C cuts that short), SIGKILLs what is left, and
# returns 0 when every node exited with status 0 and without SIGKILL.
stop_nodes() {
	local i pid st clean=0 left deadline
	for pid in "${pids[@]}"; do
		if alive "$pid"; then
			kill -TERM "$pid" 2>/dev/null || true
		fi
	done
	deadline=$((SECONDS + stop_timeout))
	while :; do
		left=0
		for pid in "${pids[@]}"; do
			if alive "$pid"; then
				left=$((left + 1))
			fi
		done
		[ "$left" -eq 0 ] && break
		if [ "$force" -eq 1 ] || [ "$SECONDS" -ge "$deadline" ]; then
			for ((i = 1; i <= ${#pids[@]}; i++)); do
				pid=${pids[i - 1]}
				if alive "$pid"; then
					if [ "$force" -eq 1 ]; then
						err "node $i (pid $pid) still running after a second interrupt: sending SIGKILL"
					else
						err "node $i (pid $pid) did not stop within ${stop_timeout}s: sending SIGKILL (see $(pretty "$data_dir/node$i.log"))"
					fi
					kill -KILL "$pid" 2>/dev/null || true
					clean=1
				fi
			done
			force=0
			deadline=$((SECONDS + 3600))
		fi
		nap 0.1
	done
	for ((i = 1; i <= ${#pids[@]}; i++)); do
		[ "${reaped[i - 1]}" -eq 1 ] && continue
		st=0
		wait "${pids[i - 1]}" 2>/dev/null || st=$?
		reaped[i - 1]=1
		if [ "$st" -ne 0 ]; then
			err "node $i exited with status $st (see $(pretty "$data_dir/node$i.log"))"
			clean=1
		fi
	done
	return "$clean"
}

# The signal trap only takes note; the loops below act on it (bash
# misbehaves when a trap runs long or nests inside another trap).
got_signal=0
on_signal() {
	if [ "$stopping" -eq 1 ]; then
		force=1
	else
		got_signal=1
	fi
}
got_request=0
on_request() { got_request=1; }

# shutdown stops the nodes after a signal and exits.
shutdown() {
	stopping=1
	echo
	say "stopping the $n nodes (SIGTERM; Ctrl-C again to kill them at once)..."
	if stop_nodes; then
		say "all $n nodes stopped cleanly; the data stays in $(pretty "$data_dir") (run again to restart the cluster)"
		exit 0
	fi
	err "the nodes did not all stop cleanly"
	exit 1
}

# fail reports a start-up failure, shows the logs, stops the nodes and exits.
fail() {
	err "$*"
	kill_sleeper
	tail_logs 20
	stopping=1
	stop_nodes >/dev/null 2>&1 || true
	exit 1
}

# A shell that starts a script in the background makes it ignore SIGINT,
# and bash cannot trap a signal ignored on entry: say how to stop it then.
int_note=""
if [ -n "$(trap -p INT)" ]; then
	int_note=" (SIGINT is ignored here, so use: kill $$)"
fi
trap on_signal INT TERM HUP
trap on_request USR1
printf '%s\n' "$$" >"$pidfile"
trap 'rm -f "$pidfile" "$request" "$request.tmp"' EXIT

# start_node starts node $1 in the background, in a process group of its
# own: a terminal's Ctrl-C reaches this script's group only, so the nodes
# get one signal, the SIGTERM of stop_nodes (a second would cut their
# shutdown short).
start_node() {
	local i=$1 log="$data_dir/node$1.log" tls_args=()
	mkdir -p "$data_dir/node$i"
	printf '=== run-cluster: node %d starting at %s ===\n' "$i" "$(date '+%Y-%m-%dT%H:%M:%S%z')" >>"$log"
	if [ "$tls" -eq 1 ]; then
		tls_args=(
			--cert-file "$certs/node$i.crt" --key-file "$certs/node$i.key" --trusted-ca-file "$certs/ca.crt" --client-cert-auth
			--peer-cert-file "$certs/node$i.crt" --peer-key-file "$certs/node$i.key" --peer-trusted-ca-file "$certs/ca.crt"
		)
	fi
	set -m
	"$server" \
		--node-id "$i" \
		--data-dir "$data_dir/node$i" \
		--listen "$host:${ports[i - 1]}" \
		--http "$host:${http_ports[i - 1]}" \
		--initial-cluster "$initial_cluster" \
		--initial-splits "$splits" \
		${tls_args[@]+"${tls_args[@]}"} \
		</dev/null >>"$log" 2>&1 &
	pids[i - 1]=$!
	set +m
	reaped[i - 1]=0
	held[i - 1]=0
}

for ((i = 1; i <= n; i++)); do
	start_node "$i"
done

# Wait until the cluster answers ClusterStatus with every node live and a
# leader for every shard.
say "waiting for the cluster to elect its leaders (up to ${ready_timeout}s)..."
deadline=$((SECONDS + ready_timeout))
while :; do
	if [ "$got_signal" -eq 1 ]; then
		shutdown
	fi
	for ((i = 1; i <= n; i++)); do
		if ! alive "${pids[i - 1]}"; then
			st=0
			wait "${pids[i - 1]}" 2>/dev/null || st=$?
			reaped[i - 1]=1
			fail "node $i exited during start-up (status $st); see $(pretty "$data_dir/node$i.log")"
		fi
	done
	if status="$("$ctl" ${ctl_tls[@]+"${ctl_tls[@]}"} --endpoints "$endpoints" --timeout 2s cluster status -o json 2>/dev/null)"; then
		shards=$(grep -c '"shard_id":' <<<"$status" || true)
		led=$(grep -c '"leader_node_id": "[1-9]' <<<"$status" || true)
		live=$(grep -c '"live": true' <<<"$status" || true)
		if [ "$shards" -gt 0 ] && [ "$led" -eq "$shards" ] && [ "$live" -ge "$n" ]; then
			break
		fi
	fi
	if [ "$SECONDS" -ge "$deadline" ]; then
		fail "the cluster did not become ready within ${ready_timeout}s (every node live, every shard with a leader); see the logs in $(pretty "$data_dir")"
	fi
	nap 0.2
done

ctl_shown="$(pretty "$ctl")"
scheme=http
security=""
if [ "$tls" -eq 1 ]; then
	scheme=https
	security=", mutual TLS (certificates in $(pretty "$certs"))"
	ctl_shown+=" --cacert $(pretty "$certs/ca.crt") --cert $(pretty "$certs/client.crt") --key $(pretty "$certs/client.key")"
fi
cat <<EOF

Shale cluster is ready: $n nodes on $host, data in $(pretty "$data_dir")$security

  node  gRPC endpoint          metrics (/metrics, /debug/pprof)   pid     log
EOF
for ((i = 1; i <= n; i++)); do
	printf '  %-4s  %-21s  %-33s  %-6s  %s\n' "$i" "$host:${ports[i - 1]}" "$scheme://$host:${http_ports[i - 1]}/metrics" "${pids[i - 1]}" "$(pretty "$data_dir/node$i.log")"
done
cat <<EOF

Try (from another terminal):
  $ctl_shown --endpoints $endpoints kv put hello world
  $ctl_shown --endpoints $endpoints kv get hello
  $ctl_shown --endpoints $endpoints cluster status
  $ctl_shown --endpoints $endpoints shard list
(or export SHALE_ENDPOINTS=$endpoints and leave out --endpoints)
EOF
if [ "$tls" -eq 1 ]; then
	cat <<EOF
(and SHALE_CACERT=$(pretty "$certs/ca.crt") SHALE_CERT=$(pretty "$certs/client.crt") SHALE_KEY=$(pretty "$certs/client.key") to leave out the TLS flags)
The HTTP ports serve HTTPS:
  curl --cacert $(pretty "$certs/ca.crt") --cert $(pretty "$certs/client.crt") --key $(pretty "$certs/client.key") https://$host:${http_ports[0]}/metrics
EOF
fi
cat <<EOF

Press Ctrl-C to stop the cluster${int_note}; run again to restart it from its data.
EOF

# answer writes the reply to a control request: its exit status, then its
# message (also shown here).
answer() {
	local st=$1
	shift
	say "$*"
	printf '%s\n%s\n' "$st" "$*" >"$reply.tmp"
	mv "$reply.tmp" "$reply"
}

# stop_one stops node $1 (SIGTERM, then SIGKILL after $stop_timeout
# seconds) and returns 0 when it exited with status 0.
stop_one() {
	local i=$1 pid=${pids[$1 - 1]} st=0 deadline=$((SECONDS + stop_timeout))
	held[i - 1]=1
	kill -TERM "$pid" 2>/dev/null || true
	while alive "$pid"; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			err "node $i (pid $pid) did not stop within ${stop_timeout}s: sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
		nap 0.1
	done
	if [ "${reaped[i - 1]}" -eq 0 ]; then
		wait "$pid" 2>/dev/null || st=$?
		reaped[i - 1]=1
	fi
	return "$st"
}

# serve_request carries out a control request (restart|stop|start N).
serve_request() {
	local what="" i="" st
	read -r what i <"$request" 2>/dev/null || true
	rm -f "$request"
	case "$i" in
	'' | *[!0-9]*) i=0 ;;
	esac
	if [ "$i" -lt 1 ] || [ "$i" -gt "$n" ]; then
		answer 1 "no node '$i': this cluster has nodes 1 to $n"
		return
	fi
	case "$what" in
	stop | restart)
		if ! alive "${pids[i - 1]}"; then
			if [ "$what" = stop ]; then
				answer 1 "node $i is not running"
				return
			fi
		else
			say "stopping node $i (pid ${pids[i - 1]}, SIGTERM)..."
			st=0
			stop_one "$i" || st=$?
			if [ "$what" = stop ]; then
				if [ "$st" -eq 0 ]; then
					answer 0 "node $i stopped cleanly; '$0 start $i' starts it again"
				else
					answer 1 "node $i exited with status $st (see $(pretty "$data_dir/node$i.log"))"
				fi
				return
			fi
		fi
		;;
	start)
		if alive "${pids[i - 1]}"; then
			answer 1 "node $i is already running (pid ${pids[i - 1]})"
			return
		fi
		;;
	*)
		answer 1 "unknown request '$what'"
		return
		;;
	esac
	if [ "${reaped[i - 1]}" -eq 0 ]; then
		wait "${pids[i - 1]}" 2>/dev/null || true # it exited on its own
		reaped[i - 1]=1
	fi
	start_node "$i"
	local deadline=$((SECONDS + ready_timeout))
	while ! "$ctl" ${ctl_tls[@]+"${ctl_tls[@]}"} --endpoints "$host:${ports[i - 1]}" --timeout 2s node list >/dev/null 2>&1; do
		if ! alive "${pids[i - 1]}"; then
			st=0
			wait "${pids[i - 1]}" 2>/dev/null || st=$?
			reaped[i - 1]=1
			answer 1 "node $i exited during start-up (status $st); see $(pretty "$data_dir/node$i.log")"
			return
		fi
		if [ "$SECONDS" -ge "$deadline" ]; then
			answer 1 "node $i (pid ${pids[i - 1]}) started but does not answer after ${ready_timeout}s; see $(pretty "$data_dir/node$i.log")"
			return
		fi
		nap 0.2
	done
	answer 0 "node $i ${what}ed: pid ${pids[i - 1]}, $host:${ports[i - 1]}"
}

# Run until a signal arrives; carry out control requests; report nodes that
# exit on their own (a node killed on purpose, say) and give up when none
# is left and none was stopped on request.
while :; do
	nap 1
	if [ "$got_signal" -eq 1 ]; then
		shutdown
	fi
	if [ "$got_request" -eq 1 ]; then
		got_request=0
		if [ -e "$request" ]; then
			serve_request
		fi
		if [ "$got_signal" -eq 1 ]; then
			shutdown
		fi
	fi
	left=0
	for ((i = 1; i <= n; i++)); do
		if alive "${pids[i - 1]}"; then
			left=$((left + 1))
		elif [ "${reaped[i - 1]}" -eq 0 ]; then
			st=0
			wait "${pids[i - 1]}" 2>/dev/null || st=$?
			reaped[i - 1]=1
			err "node $i (pid ${pids[i - 1]}) exited with status $st; the others keep running ('$0 start $i' starts it again; see $(pretty "$data_dir/node$i.log"))"
		fi
	done
	if [ "$left" -eq 0 ] && [[ " ${held[*]} " != *" 1 "* ]]; then
		err "every node has exited"
		exit 1
	fi
done
