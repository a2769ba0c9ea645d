#!/usr/bin/env bash
# Open MPI's "ssh" for fake nodes (mpirun --mca plm_rsh_agent netns_rsh.sh): runs the remote command inside
# the node's network namespace and in a UTS namespace of its own with the node's hostname (with equal
# hostnames, Open MPI's shared-memory files of different fake nodes collide and ranks crash).
#   netns_rsh.sh HOST COMMAND...   HOST is an address from the hostfile; MT_NETNS_HOSTS maps it:
#   MT_NETNS_HOSTS="10.77.0.11=NETNS:HOSTNAME 10.77.0.12=NETNS:HOSTNAME"  (set by netns_fixture.sh)
# SPDX-License-Identifier: MIT
set -u
host=$1
shift
entry=
for e in ${MT_NETNS_HOSTS:-}; do
    [ "${e%%=*}" = "$host" ] && entry=${e#*=}
done
if [ -z "$entry" ]; then
    echo "netns_rsh.sh: unknown host '$host' (MT_NETNS_HOSTS='${MT_NETNS_HOSTS:-}')" >&2
    exit 255
fi
ns=${entry%%:*}
name=${entry#*:}
# Open MPI passes the remote command as shell words (e.g. "PATH=... ; export PATH ; orted ..."): like ssh,
# hand them to a shell as one string.
exec ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$1" && shift && exec sh -c "$*"' sh "$name" "$@"
