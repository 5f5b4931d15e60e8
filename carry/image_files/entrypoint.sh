#!/bin/sh
# carry's image entrypoint: export the runtime defaults from /etc/carry/runtime.env (build.yaml's image.env)
# unless the caller already set them, then run the command.
set -eu
if [ -f /etc/carry/runtime.env ]; then
    while IFS= read -r line; do
        name=${line%%=*}
        eval "current=\${$name+set}"
        [ -n "$current" ] || eval "export $line"
    done < /etc/carry/runtime.env
fi
exec "$@"
