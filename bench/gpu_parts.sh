# Sourced by bench/gpu_bundle_*.sh here: cut_parts KIND FILE cuts FILE (a compressed tar) into parts
# that each fit one device call beside the repository (64 MiB a call in all, less the repository's size
# now, less 3 MiB; PART overrides), one part a git-ignored folder .gpu-KIND1, .gpu-KIND2, ... with
# KIND.sha256 (the whole file's sum and the number of parts) in each; bench/gpu_agent.sh joins them.
cut_parts() {
    # The repository travels with every call: tracked files and untracked ones git does not ignore.
    repo=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 stat -c %s 2>/dev/null \
        | awk '{s += $1} END {print s}')
    PART=${PART:-$((64 * 1048576 - repo - 3 * 1048576))}
    rm -rf .gpu-$1[0-9]*
    split -b "$PART" -d -a 2 "$2" "$2."
    sum=$(sha256sum "$2" | cut -d' ' -f1)
    n=0
    for part in "$2".[0-9]*; do
        n=$((n + 1))
        mkdir -p .gpu-$1$n && mv "$part" .gpu-$1$n/
    done
    for d in .gpu-$1[0-9]*; do echo "$sum $n" > "$d/$1.sha256"; done
    echo "$(basename "$2") $(stat -c %s "$2") bytes, repository $repo bytes, part $PART bytes: $n folders" \
        "(.gpu-$1""1 .. .gpu-$1$n), one device call each"
    du -sh .gpu-$1[0-9]*
}
