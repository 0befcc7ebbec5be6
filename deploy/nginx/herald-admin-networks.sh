#!/bin/sh
# Run by the nginx image from /docker-entrypoint.d/ before nginx starts (docker-compose.yml mounts it there):
# writes HERALD_ADMIN_NETWORKS (addresses or CIDR networks, comma-separated) as the entries of the `geo`
# block of deploy/nginx/herald.conf.template, into HERALD_ADMIN_NETWORKS_FILE. Empty: no entry, and
# /admin/ and /metrics answer 403 to everyone. nginx itself refuses to start on an entry that is not an
# address or network; this refuses anything that could be more than one.
set -euf  # -f: no file name expansion of what the variable holds
out="${HERALD_ADMIN_NETWORKS_FILE:?HERALD_ADMIN_NETWORKS_FILE names the file to write}"
entries=""
for network in $(printf '%s' "${HERALD_ADMIN_NETWORKS:-}" | tr ',' ' '); do
    case "$network" in
        *[!0-9A-Fa-f:./]*)
            echo "herald-admin-networks: HERALD_ADMIN_NETWORKS: '$network' is not an address or CIDR network" >&2
            exit 1 ;;
    esac
    entries="$entries$network 1;
"
done
printf '# from HERALD_ADMIN_NETWORKS, by herald-admin-networks.sh\n%s' "$entries" > "$out"
echo "herald-admin-networks: /admin/ and /metrics for: ${HERALD_ADMIN_NETWORKS:-nobody}"
