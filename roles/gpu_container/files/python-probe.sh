# shellcheck shell=sh
# What is wrong with a container's own Python, asked with sh alone (no Python needed): $1 is the interpreter.
# Prints link=, exists=, rc= and out= (whether it starts and its version, or its last error line), pkg= (the
# Python packages dpkg knows, with their status) and os= (the distribution). Read by plugin_utils/_container_python
# (the drift, verify and repair runs) and run by the doctor on each running container (gpu_container's doctor).
p=$1
if [ -L "$p" ]; then echo "link=$(readlink "$p")"; fi
if [ -e "$p" ]; then
  echo exists=1
  out=$("$p" -c 'import encodings, sys; print("%d.%d" % sys.version_info[:2])' 2>&1); echo "rc=$?"
  printf 'out=%s\n' "$(printf '%s' "$out" | tail -n 1)"
fi
if command -v dpkg-query >/dev/null 2>&1; then
  dpkg-query -W -f='pkg=${Package} ${db:Status-Abbrev}\n' python3 python3-minimal 'python3.[0-9]*' \
    'libpython3.[0-9]*-minimal' 'libpython3.[0-9]*-stdlib' 2>/dev/null
fi
if [ -r /etc/os-release ]; then . /etc/os-release; echo "os=$ID $VERSION_ID"; fi
