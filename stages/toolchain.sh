#!/bin/sh
# DVC stage `toolchain`'s command (it runs on every `dvc repro`). Where this stage's last record is kept
# with its key (build/.toolchain/<stage>/, written by stages/toolchain.py: the environment, and the size,
# mtime and inode of every file the record was made from, DVC's own rule for a changed file) and the key
# is unchanged, the record is copied back without starting Python; otherwise stages/toolchain.py runs.
set -u
stage=${DVC_STAGE:-toolchain}
keep="build/.toolchain/${stage##*:}"  # the stage's name without its file (stages/dvc.yaml:)
PIPELINE_TOOLCHAIN_ENV=$(env | LC_ALL=C sort | grep -Ev '^(DVC_[A-Z_]*|PWD|OLDPWD|SHLVL|_|PIPELINE_TOOLCHAIN_ENV)=')
export PIPELINE_TOOLCHAIN_ENV
if [ -n "${DVC_STAGE:-}" ] && [ -z "${DVC_EXP_NAME:-}" ] && [ -f "$keep/key" ] && [ -f "$keep/files" ] \
        && [ -f "$keep/out" ] && [ -f "$keep/record.json" ]; then
    now=$(printf '%s\n' "$PIPELINE_TOOLCHAIN_ENV"
          tr '\n' '\0' < "$keep/files" | xargs -0 -r stat -L -c '%n %s %.9Y %i' -- 2>/dev/null)
    if [ "$now" = "$(cat "$keep/key")" ]; then
        out=$(cat "$keep/out")
        tmp="$out.pipeline-tmp.$$"  # renamed into place: never written through a link at $out
        mkdir -p "$(dirname "$out")" && cp "$keep/record.json" "$tmp" && mv -f "$tmp" "$out" && exit 0
        rm -f "$tmp"
    fi
fi
exec python stages/toolchain.py "$@"
