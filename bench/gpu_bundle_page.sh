#!/bin/sh
# What the device machine needs to open the voice agent's page in a headless browser
# (bench/gpu_agent.sh page): its image has Python 3.12 and no Chromium, no Node, no apt, no network.
# Packed into git-ignored folders .gpu-page1/, .gpu-page2/, ... that each fit one device call
# beside the repository (64 MiB a call in all):
# - chromium/: Debian's chromium and chromium-common (the version installed here, which the browser
#   test drives: `apt-get download`, `dpkg -x`), less the Vulkan validation layer and other locales;
# - lib/: every shared library that chromium, its crashpad handler and its own libraries load,
#   worked out with ldd against the packages unpacked here and fetched the same way, round after
#   round until nothing resolves outside them, except glibc, libstdc++ and libgcc_s (the device's
#   own: glibc must match its loader, the other two are newer there). Only chromium.sh puts it on
#   LD_LIBRARY_PATH; nothing is unpacked into / on the device;
# - node-lib/: libatomic.so.1 for the Node.js that Playwright's wheel carries (a server image may
#   lack libatomic1); fonts/: DejaVu and a fonts.conf, so the screenshot has text;
# - site/: the Playwright wheel (pinned in pyproject.toml) and greenlet for Python 3.12, unpacked
#   (recompressed with the rest: smaller than the wheels), for PYTHONPATH;
# - question.wav: the browser test's question as its fake microphone plays it (Piper, made here).
# Then checks that the unpacked chromium runs headless from lib/ alone: in a mount namespace whose
# /usr/lib/x86_64-linux-gnu holds only glibc, libstdc++ and libgcc_s (unshare; skipped, with a
# note, where it is not allowed), `--dump-dom` of a page, and Node.js's --version. One xz'd tar, cut
# into parts (bench/gpu_parts.sh), one part a folder, with page.sha256 (the whole tar's) in each;
# bench/gpu_agent.sh joins and checks them.
# Usage: sh bench/gpu_bundle_page.sh   (needs .venv, Debian's chromium installed here: make test;
#                                       ~4 min on 2 cores, ~900 MB in /tmp)
set -eu
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OWN="libc6 libstdc++6 libgcc-s1"  # the device's own (see above)
stage=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$stage"' EXIT  # KEEP=1: leave it (its path is printed)
echo "staging in $stage"
root=$stage/root page=$stage/page
mkdir -p "$stage/debs" "$root" "$page/lib" "$page/node-lib" "$page/fonts" "$page/site"

fetch() {  # PACKAGE...: download the versions installed here (else the mirror's), unpack them into $root
    for p in "$@"; do
        v=$(dpkg-query -W -f '${Version}' "$p" 2>/dev/null) || { echo "$p is not installed here" >&2; exit 1; }
        (cd "$stage/debs" && { apt-get download -q=2 "$p=$v" || apt-get download -q=2 "$p"; } 2>&1 \
            | grep -v "unsandboxed\|Can't find a source" >&2 || true)
        deb=$(ls "$stage"/debs/"$p"_*.deb) || exit 1
        dpkg -x "$deb" "$root"
        echo "$(basename "$deb" .deb)" >> "$stage/packages"
    done
}

libdirs() { find "$root" -name "*.so*" -printf '%h\n' | sort -u | tr '\n' ':'; }

outside() {  # the packages of the libraries chromium's ELF files resolve outside $root (not OWN)
    path=$(libdirs)
    for f in "$root"/usr/lib/chromium/chromium "$root"/usr/lib/chromium/chrome_crashpad_handler \
        $(find "$root" -name "*.so*" -type f); do
        LD_LIBRARY_PATH=$path ldd "$f" 2>/dev/null
    done | awk '$2 == "=>" {print $1, $3}' | sort -u | while read -r name where; do
        [ "$where" = "not" ] && { echo "ldd: $name not found here" >&2; exit 1; }
        case $where in "$root"/*) continue ;; esac
        dpkg -S "*/x86_64-linux-gnu/$name" 2>/dev/null | head -1 | cut -d: -f1
    done | sort -u | grep -vxF "$(echo $OWN | tr ' ' '\n')" || true
}

fetch chromium chromium-common fonts-dejavu-core libatomic1
rounds=0
while more=$(outside) && [ -n "$more" ]; do
    rounds=$((rounds + 1))
    [ $rounds -le 8 ] || { echo "closure not reached after 8 rounds: $more" >&2; exit 1; }
    echo "round $rounds: $(echo $more)"
    fetch $more
done

# chromium/: the browser, as Debian lays it out (it finds its .pak, ICU and locales beside itself).
cp -a "$root/usr/lib/chromium" "$page/chromium"
rm -f "$page"/chromium/libVkLayer_khronos_validation.so*
find "$page/chromium/locales" -type f ! -name "en-US.pak" -delete
# lib/: the unpacked libraries (relative symlinks kept), from both of Debian's library folders.
for d in "$root/lib/x86_64-linux-gnu" "$root/usr/lib/x86_64-linux-gnu"; do
    [ -d "$d" ] && cp -a "$d/." "$page/lib/"
done
mv "$page"/lib/libatomic.so* "$page/node-lib/"
find "$page/lib" -type l -lname "/*" -delete  # none seen; an absolute link would point off the bundle
cp "$root"/usr/share/fonts/truetype/dejavu/*.ttf "$page/fonts/"
cat > "$page/fonts/fonts.conf" << 'EOF'
<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig><dir prefix="relative">.</dir><cachedir>/tmp/voxgate-page-fonts</cachedir></fontconfig>
EOF
cat > "$page/chromium.sh" << 'EOF'
#!/bin/sh
# Debian's chromium with the libraries and fonts of this folder (bench/gpu_bundle_page.sh).
here=$(dirname "$(readlink -f "$0")")
export LD_LIBRARY_PATH="$here/lib:$here/lib/pulseaudio${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FONTCONFIG_FILE="$here/fonts/fonts.conf"
exec "$here/chromium/chromium" "$@"
EOF
chmod +x "$page/chromium.sh"
cp "$stage/packages" "$page/packages.txt"

# site/: Playwright (the version pyproject pins, as this .venv runs it) and greenlet for Python 3.12.
pins=$($PY -c "import importlib.metadata as m; print(*(f'{n}=={m.version(n)}' for n in ('playwright', 'greenlet')))")
python3 -m pip download -q --no-deps --dest "$stage/wheels" --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 $pins
for w in "$stage"/wheels/*.whl; do $PY -m zipfile -e "$w" "$page/site"; done
strip "$page"/site/playwright/driver/node  # its debug info and symbol table: 4.5 MB of the xz, a device call
chmod +x "$page"/site/playwright/driver/node
echo "$pins" > "$page/site/pins.txt"

$PY -m voxgate bench page --record-question "$page/question.wav"

# The check: chromium headless from lib/ alone, and Playwright's Node.js from node-lib/ alone, where
# the system's library folder has only OWN's files (a mount namespace: nothing changes outside it).
echo "<p>voxgate-page-ok</p>" > "$stage/ok.html"
check="$page/chromium.sh --headless --no-sandbox --disable-gpu --dump-dom file://$stage/ok.html"
node="env LD_LIBRARY_PATH=$page/node-lib $page/site/playwright/driver/node --version"
if unshare -m true 2> /dev/null; then
    bare=$stage/bare && mkdir -p "$bare"
    for p in $OWN; do dpkg -L "$p:amd64" | grep "x86_64-linux-gnu/[^/]*$" | xargs -I{} cp -a {} "$bare/" 2> /dev/null || true; done
    isolated() { unshare -m sh -c "mount --bind $bare /usr/lib/x86_64-linux-gnu && exec env -i HOME=/tmp $1"; }
    where="a bare library folder ($(ls "$bare" | wc -l) files of $OWN)"
else
    isolated() { sh -c "exec env -i HOME=/tmp $1"; }
    where="this machine's libraries behind lib/ (unshare not allowed here: a weaker check)"
fi
dom=$(isolated "$check" 2> "$stage/check.err") || true
case $dom in
    *voxgate-page-ok*) echo "chromium runs headless from the bundle with $where" ;;
    *) echo "chromium did NOT run from the bundle with $where:" >&2; tail -20 "$stage/check.err" >&2; exit 1 ;;
esac
version=$(isolated "$node" 2>&1) || { echo "Playwright's node did NOT run with $where: $version" >&2; exit 1; }
echo "Playwright's node $version runs with $where"

(cd "$stage" && tar -cf - page | xz -T2 -9 > page.txz)
echo "packages: $(wc -l < "$page/packages.txt"), unpacked $(du -sm "$page" | cut -f1) MB"
. bench/gpu_parts.sh
cut_parts page "$stage/page.txz"
