#!/usr/bin/env bash
# Why this exists: aether's cooperative-matrix (VK_KHR_cooperative_matrix)
# kernels need a Vulkan driver that exposes the extension. Bookworm's Mesa
# lavapipe (22.x) does not; Mesa 26.x lavapipe from trixie-backports does
# (8x8x8 f16->f16 and f16->f32). So CI builds a minimal trixie chroot holding
# that Mesa and runs host-built binaries (glibc 2.36 runs fine on trixie's 2.41)
# inside it, with the repository bind-mounted at the same absolute path.
#
#   .ci/coop-lavapipe.sh setup DIR                  create/complete the chroot (idempotent)
#   .ci/coop-lavapipe.sh run DIR PROGRAM [ARGS...]  run PROGRAM inside it; exits with its status
#
# Both need root. Mounts are made in a private mount namespace (unshare) when
# possible, and are always unmounted on exit by a trap.
set -euo pipefail

SUITE=trixie
MIRROR="${AETHER_COOP_MIRROR:-http://deb.debian.org/debian}"
MARKER=.aether-coop-lavapipe-ready
CHROOT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/$(basename "${BASH_SOURCE[0]}")"
REPO_ROOT="$(cd "$(dirname "$SELF")/.." && pwd -P)"
ICD_DIR=/usr/share/vulkan/icd.d

log() { echo "coop-lavapipe: $*" >&2; }
die() { log "error: $*"; exit 2; }
usage() {
    cat >&2 <<EOF
usage: $0 setup DIR                  create/complete the trixie chroot at DIR (idempotent)
       $0 run DIR PROGRAM [ARGS...]  run PROGRAM inside it; exits with PROGRAM's status
EOF
    exit 2
}

# Lavapipe's ICD manifest inside chroot DIR: Mesa 26 ships lvp_icd.json (its
# library_path is a bare soname); older Mesa used lvp_icd.<arch>.json.
find_icd() { # DIR
    local f
    for f in "$ICD_DIR/lvp_icd.json" "$ICD_DIR/lvp_icd.$(uname -m).json"; do
        [ -f "$1$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

need_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap/chroot/mount)"; }

# Absolute, symlink-free path for DIR (DIR itself need not exist yet).
abs_dir() { realpath -m -- "$1"; }

# Re-exec this script in a private mount namespace so that our mounts are
# invisible to (and cannot be torn down by) concurrent runs, and vanish even if
# we are SIGKILLed. Falls back to the shared namespace when unshare is unusable.
enter_private_ns() {
    if [ -z "${_COOP_LAVAPIPE_NS:-}" ] && command -v unshare >/dev/null 2>&1 \
        && unshare --mount --propagation private true 2>/dev/null; then
        export _COOP_LAVAPIPE_NS=1
        exec unshare --mount --propagation private -- "$BASH" "$SELF" "$@"
    fi
}

# Mount bookkeeping: everything in MOUNTED is unmounted (reverse order) on exit.
MOUNTED=()
cleanup_mounts() {
    local i m
    for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
        m="${MOUNTED[i]}"
        umount -R "$m" 2>/dev/null || umount -R -l "$m" 2>/dev/null \
            || log "warning: could not unmount $m"
    done
    MOUNTED=()
}
# While PROGRAM runs (CHILD set) a signal is forwarded to it and we go on
# waiting, so its own exit status is returned; otherwise we exit at once.
CHILD=
on_signal() { # SIGNAL EXIT_STATUS
    if [ -n "$CHILD" ]; then
        kill -s "$1" "$CHILD" 2>/dev/null || true
    else
        exit "$2"
    fi
}
install_traps() {
    trap cleanup_mounts EXIT
    trap 'on_signal INT 130' INT
    trap 'on_signal TERM 143' TERM
    trap 'on_signal HUP 129' HUP
}

mount_system() { # DIR
    local dir="$1"
    install_traps
    mkdir -p "$dir/proc" "$dir/dev" "$dir/sys"
    mount -t proc proc "$dir/proc"
    MOUNTED+=("$dir/proc")
    mount --rbind /dev "$dir/dev"
    MOUNTED+=("$dir/dev")
    mount --make-rslave "$dir/dev"
    mount --rbind /sys "$dir/sys"
    MOUNTED+=("$dir/sys")
    mount --make-rslave "$dir/sys"
}

# Refuse to delete a directory that still has something mounted under it (a
# leftover bind mount of /dev or of the repository would be deleted with it).
has_mounts_under() { # DIR
    awk -v d="$1" '$5 == d || index($5, d "/") == 1 { found = 1 } END { exit !found }' \
        /proc/self/mountinfo
}

chroot_exec() { # DIR CMD... (clean environment)
    local dir="$1"
    shift
    chroot "$dir" /usr/bin/env -i PATH="$CHROOT_PATH" HOME=/root LANG=C.UTF-8 \
        DEBIAN_FRONTEND=noninteractive "$@"
}

cmd_setup() {
    [ $# -eq 1 ] || usage
    need_root
    local dir
    dir="$(abs_dir "$1")"
    [ "$dir" != / ] || die "refusing to use / as the chroot"
    if [ -f "$dir/$MARKER" ] && find_icd "$dir" >/dev/null; then
        log "$dir already set up ($(cat "$dir/$MARKER"))"
        return 0
    fi
    enter_private_ns setup "$dir"

    if [ -d "$dir/debootstrap" ]; then
        # An interrupted debootstrap leaves this behind; it cannot be resumed.
        has_mounts_under "$dir" && die "$dir has mounts under it; unmount them first"
        log "removing incomplete debootstrap in $dir"
        rm -rf --one-file-system -- "$dir"
    fi
    if [ ! -x "$dir/usr/bin/apt-get" ]; then
        if [ -d "$dir" ] && [ -n "$(ls -A -- "$dir")" ]; then
            die "$dir exists, is not empty and is not a chroot made by this script"
        fi
        if ! command -v debootstrap >/dev/null 2>&1; then
            log "installing debootstrap on the host"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                debootstrap >/dev/null
        fi
        log "debootstrap $SUITE into $dir (takes a few minutes)"
        mkdir -p "$dir"
        debootstrap --variant=minbase "$SUITE" "$dir" "$MIRROR" >"$dir.debootstrap.log" 2>&1 \
            || { tail -n 30 "$dir.debootstrap.log" >&2; die "debootstrap failed (log: $dir.debootstrap.log)"; }
        rm -f "$dir.debootstrap.log"
    fi

    cat >"$dir/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $MIRROR $SUITE-backports main
EOF
    # No daemons may start inside the chroot.
    printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
    chmod 755 "$dir/usr/sbin/policy-rc.d"
    # rm first: never write through a symlink that could point into the host.
    rm -f "$dir/etc/resolv.conf"
    cp -L /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true

    mount_system "$dir"
    log "installing Mesa (lavapipe) from $SUITE-backports"
    chroot_exec "$dir" apt-get update -qq
    chroot_exec "$dir" apt-get install -y -qq --no-install-recommends -t "$SUITE-backports" \
        mesa-vulkan-drivers libvulkan1 vulkan-tools >/dev/null
    chroot_exec "$dir" apt-get clean
    rm -rf "$dir"/var/lib/apt/lists/*
    cleanup_mounts

    find_icd "$dir" >/dev/null || die "no lavapipe ICD (lvp_icd*.json) in $dir$ICD_DIR after install"
    # shellcheck disable=SC2016 # ${Version} is dpkg-query's, not ours
    chroot_exec "$dir" dpkg-query -W -f='mesa-vulkan-drivers ${Version}\n' mesa-vulkan-drivers \
        >"$dir/$MARKER"
    log "ready: $dir ($(cat "$dir/$MARKER"))"
}

cmd_run() {
    [ $# -ge 2 ] || usage
    need_root
    local dir cwd name icd
    dir="$(abs_dir "$1")"
    shift
    if [ ! -f "$dir/$MARKER" ] || ! icd="$(find_icd "$dir")"; then
        die "$dir is not a ready chroot; run: $0 setup $dir"
    fi
    cwd="$(pwd -P)"
    enter_private_ns run "$dir" "$@"

    local envs=(PATH="$CHROOT_PATH" HOME=/root LANG=C.UTF-8
        XDG_RUNTIME_DIR=/run/aether-xdg VK_DRIVER_FILES="$icd" VK_ICD_FILENAMES="$icd")
    while IFS= read -r name; do
        case "$name" in
            AETHER_* | CI | RUST_BACKTRACE | RUST_TEST_THREADS | RUST_LOG)
                envs+=("$name=${!name}") ;;
        esac
    done < <(compgen -e)

    mount_system "$dir"
    mkdir -p "$dir$REPO_ROOT"
    mount --rbind "$REPO_ROOT" "$dir$REPO_ROOT"
    MOUNTED+=("$dir$REPO_ROOT")
    mount --make-rslave "$dir$REPO_ROOT"
    mkdir -p "$dir/run/aether-xdg"
    chmod 700 "$dir/run/aether-xdg"
    [ -d "$dir$cwd" ] || die "working directory $cwd does not exist inside the chroot (only $REPO_ROOT is bind-mounted)"

    # In the background (stdin kept) so that trapped signals can be forwarded.
    chroot "$dir" /usr/bin/env -i -C "$cwd" "${envs[@]}" "$@" <&0 &
    CHILD=$!
    # A trapped signal interrupts `wait`; keep waiting until the child is reaped,
    # then fetch its real status (bash remembers it).
    while kill -0 "$CHILD" 2>/dev/null; do wait "$CHILD" || true; done
    local rc=0
    wait "$CHILD" || rc=$?
    CHILD=
    cleanup_mounts
    return "$rc"
}

[ $# -ge 1 ] || usage
sub="$1"
shift
case "$sub" in
    setup) cmd_setup "$@" ;;
    run) cmd_run "$@" ;;
    -h | --help | help) usage ;;
    *) usage ;;
esac
