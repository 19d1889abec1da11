# Sourced by the setup scripts: the machine-wide cache of what they fetch
# from registries (the debootstrapped image, the guest kernel, the Python
# venv), so that a clean clone on a machine that has run them once needs no
# network for them again. $NAMZU_CACHE, else /var/cache/namzu (root), else
# target/cache inside the clone. Sets $cache.
cache=${NAMZU_CACHE:-/var/cache/namzu}
if ! mkdir -p "$cache" 2>/dev/null || ! [ -w "$cache" ]; then
    cache=$(pwd)/target/cache
    mkdir -p "$cache"
fi
