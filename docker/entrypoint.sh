#!/usr/bin/env bash
# Entry point of the bert_tf image.
#   run CMD...              run a command (default: the demo)
#   worker                  start sshd on $SSH_PORT for horovodrun/mpirun from another node; needs the
#                           public key of the launching node in /keys/authorized_keys (mounted)
#   launch HOSTFILE ARGS... needs the private key in /keys/id_ed25519 (mounted); checks every host of
#                           HOSTFILE resolves and answers ssh, and that --checkpoint_dir can be written,
#                           then horovodrun -np <total slots> -hostfile HOSTFILE -p $SSH_PORT python run/pretrain.py ARGS
set -euo pipefail
SSH_PORT="${SSH_PORT:-12345}"
KEYS="${BERT_TF_KEYS:-/keys/authorized_keys}"
PRIVATE_KEY="${BERT_TF_PRIVATE_KEY:-/keys/id_ed25519}"
die() { echo "bert-tf-entrypoint: $*" >&2; exit 2; }

# Hostfile lines without comments and blank lines: Horovod 0.28.1's parser rejects '#' lines.
clean_hostfile() { sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^[[:space:]]*$/d' "$1"; }

mode="${1:-}"
[ $# -gt 0 ] && shift
case "$mode" in
  run)
    [ $# -gt 0 ] || die "run needs a command, e.g. run bash scripts/demo.sh"
    exec "$@"
    ;;
  worker)
    [ -s "$KEYS" ] || die "worker mode needs the launcher's public key in $KEYS (mount it: -v ~/.ssh/id_ed25519.pub:$KEYS:ro)"
    ssh_dir="$HOME/.ssh"
    mkdir -p "$ssh_dir" && chmod 700 "$ssh_dir"
    cp "$KEYS" "$ssh_dir/authorized_keys" && chmod 600 "$ssh_dir/authorized_keys"
    hostkeys="$HOME/.sshd"
    mkdir -p "$hostkeys"
    [ -f "$hostkeys/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N "" -f "$hostkeys/ssh_host_ed25519_key"
    # ranks started over ssh need the image's environment: sshd passes it via PermitUserEnvironment
    env | grep -E '^(PATH|BERT_TF_|TF_CPP_|NCCL_|HOROVOD_|OMPI_|LD_LIBRARY_PATH)=' > "$ssh_dir/environment" || true
    echo "bert-tf-entrypoint: worker $(hostname) listening for ssh on port $SSH_PORT" >&2
    exec /usr/sbin/sshd -D -e -p "$SSH_PORT" -h "$hostkeys/ssh_host_ed25519_key" \
      -o PidFile="$hostkeys/sshd.pid" -o PermitUserEnvironment=yes -o PasswordAuthentication=no \
      -o StrictModes=no -o UsePAM=no
    ;;
  launch)
    hostfile="${1:-}"
    [ -n "$hostfile" ] || die "launch needs a hostfile: launch hostfiles/hosts --flagfile=..."
    [ -f "$hostfile" ] || die "hostfile not found: $hostfile"
    shift
    [ -s "$PRIVATE_KEY" ] || die "launch mode needs the private key whose public half the workers hold, at $PRIVATE_KEY (mount it: -v ~/.ssh/id_ed25519:$PRIVATE_KEY:ro)"
    # One ssh setup for horovodrun's checks and for the orted daemons its mpirun starts (plain ssh):
    # the workers' port, their new host keys accepted (each worker makes its own at start), and a
    # dead worker noticed within ~15 s.
    ssh_dir="$HOME/.ssh"
    { mkdir -p "$ssh_dir" && chmod 700 "$ssh_dir" && touch "$ssh_dir/config"; } 2>/dev/null \
      || die "$ssh_dir is not writable: mount the key at $PRIVATE_KEY instead of mounting ~/.ssh"
    install -m 600 "$PRIVATE_KEY" "$ssh_dir/id_launch"
    printf '%s\n' "Host *" "  Port $SSH_PORT" "  IdentityFile $ssh_dir/id_launch" \
      "  StrictHostKeyChecking accept-new" "  UserKnownHostsFile $ssh_dir/known_hosts" "  BatchMode yes" \
      "  ConnectTimeout 10" "  ServerAliveInterval 5" "  ServerAliveCountMax 3" > "$ssh_dir/config"
    chmod 600 "$ssh_dir/config"
    clean="$(mktemp "${TMPDIR:-/tmp}/hostfile.XXXXXX")"
    clean_hostfile "$hostfile" > "$clean"
    local_ips=" $(hostname -I 2>/dev/null || true) "
    slots=0
    while read -r host rest; do
      ip=$(getent hosts "$host" | awk '{print $1; exit}') || true
      [ -n "$ip" ] || die "host '$host' in $hostfile does not resolve (check the name, /etc/hosts or DNS)"
      if [[ "$local_ips" != *" $ip "* && "$ip" != 127.* && "$ip" != ::1 ]]; then
        err=$(ssh "$host" true 2>&1 </dev/null | tr -d '\r') \
          || die "host '$host' in $hostfile does not answer ssh on port $SSH_PORT: ${err:-ssh failed} (is a 'worker' container running there with the launcher's public key?)"
      fi
      n=$(sed -n 's/.*slots=\([0-9]*\).*/\1/p' <<<"$rest"); slots=$((slots + ${n:-1}))
    done < "$clean"
    [ "$slots" -gt 0 ] || die "no hosts in $hostfile"
    # Checkpoints need a volume (shared by the nodes): fail now, not at the first save.
    ckpt=$(printf '%s\n' "$@" | sed -n 's/^--checkpoint_dir=//p' | tail -n 1)
    if [ -z "$ckpt" ]; then
      flagfile=$(printf '%s\n' "$@" | sed -n 's/^--flagfile=//p' | tail -n 1)
      [ -z "$flagfile" ] || ckpt=$(sed -n 's/^--checkpoint_dir=//p' "$flagfile" 2>/dev/null | tail -n 1)
    fi
    if [ -n "$ckpt" ]; then
      { mkdir -p "$ckpt" && [ -w "$ckpt" ]; } 2>/dev/null \
        || die "--checkpoint_dir=$ckpt cannot be created or written in this container: mount a volume there, e.g. -v /shared/ckpt:$(cut -d/ -f1-2 <<<"$ckpt")"
    fi
    echo "bert-tf-entrypoint: $slots ranks on $(awk '{print $1}' "$clean" | paste -sd, -)" >&2
    exec horovodrun -np "$slots" -hostfile "$clean" -p "$SSH_PORT" python run/pretrain.py "$@"
    ;;
  *)
    die "unknown mode '${mode}'; valid modes: run CMD..., worker, launch HOSTFILE ARGS..."
    ;;
esac
