#!/bin/sh
# Runs a rank of concordrun's job as if on a host of its own: CONCORD_HOST_ID names one host per
# rank, so its communicators share no memory (the lanes are Gloo's TCP pairs, as across hosts).
#   pretend_host.sh program args...
CONCORD_HOST_ID="pretend-host-${CONCORD_RANK:?pretend_host.sh runs under concordrun}"
export CONCORD_HOST_ID
exec "$@"
