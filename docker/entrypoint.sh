#!/usr/bin/env bash
# Entry point of the bert_tf image.
#   run CMD...              run a command (default: the demo)
#   worker                  start sshd on $SSH_PORT for horovodrun/mpirun from another node; needs the
#                           public key of the launching node in /keys/authorized_keys (mounted)
#   launch HOSTFILE ARGS... check every host in HOSTFILE resolves, then
#                           horovodrun -np <total slots> -hostfile HOSTFILE -p $SSH_PORT python run/pretrain.py ARGS
set -euo pipefail
SSH_PORT="${SSH_PORT:-12345}"
KEYS="${BERT_TF_KEYS:-/keys/authorized_keys}"
die() { echo "bert-tf-entrypoint: $*" >&2; exit 2; }

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
    exec /usr/sbin/sshd -D -e -p "$SSH_PORT" -h "$hostkeys/ssh_host_ed25519_key" \
      -o PidFile="$hostkeys/sshd.pid" -o PermitUserEnvironment=yes -o PasswordAuthentication=no \
      -o StrictModes=no -o UsePAM=no
    ;;
  launch)
    hostfile="${1:-}"
    [ -n "$hostfile" ] || die "launch needs a hostfile: launch hostfiles/hosts --flagfile=..."
    [ -f "$hostfile" ] || die "hostfile not found: $hostfile"
    shift
    slots=0
    while read -r host rest; do
      case "$host" in ""|\#*) continue ;; esac
      getent hosts "$host" >/dev/null || die "host '$host' in $hostfile does not resolve (check the name, /etc/hosts or DNS)"
      n=$(sed -n 's/.*slots=\([0-9]*\).*/\1/p' <<<"$rest"); slots=$((slots + ${n:-1}))
    done < "$hostfile"
    [ "$slots" -gt 0 ] || die "no hosts in $hostfile"
    # Worker host keys are generated per container: horovodrun's ssh already runs with
    # StrictHostKeyChecking=no (horovod/runner/util/remote.py), so no known_hosts is needed.
    exec horovodrun -np "$slots" -hostfile "$hostfile" -p "$SSH_PORT" python run/pretrain.py "$@"
    ;;
  *)
    die "unknown mode '${mode}'; valid modes: run CMD..., worker, launch HOSTFILE ARGS..."
    ;;
esac
