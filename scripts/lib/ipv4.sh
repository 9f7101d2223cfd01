# shellcheck shell=bash
# IPv4 helpers for the scripts (sourced; defines functions only). scripts/quickstart.sh uses them to refuse a
# pod network whose route another interface would take.

# ipv4_int A.B.C.D: the address as a 32-bit number.
ipv4_int() {
	local IFS=. a b c d
	read -r a b c d <<<"$1"
	echo $(((a << 24) | (b << 16) | (c << 8) | d))
}

# ipv4_overlaps A/P B/Q: whether the two networks share an address (one holds the other).
ipv4_overlaps() {
	local a=${1%/*} p=${1#*/} b=${2%/*} q=${2#*/} n mask
	n=$((p < q ? p : q))
	mask=$(((0xffffffff << (32 - n)) & 0xffffffff))
	[ $(($(ipv4_int "$a") & mask)) -eq $(($(ipv4_int "$b") & mask)) ]
}

# ipv4_claims_of CIDR BRIDGE: the interfaces other than BRIDGE holding an IPv4 network that overlaps CIDR
# with a prefix at least as long, one "DEV ADDR/PREFIX" per line. Such a network takes the route to (some of)
# the pods on BRIDGE: the kernel prefers the longer prefix, and the first of two equal routes. A broader
# network is left alone: CIDR's own, longer route wins for its addresses.
ipv4_claims_of() {
	local cidr=$1 bridge=$2 dev addr
	while read -r _ dev _ addr _; do
		[ "$dev" = "$bridge" ] && continue
		if [ "${addr#*/}" -ge "${cidr#*/}" ] && ipv4_overlaps "$cidr" "$addr"; then echo "$dev $addr"; fi
	done < <(ip -4 -o addr show 2>/dev/null)
}
