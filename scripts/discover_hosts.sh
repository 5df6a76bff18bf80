#!/usr/bin/env bash
# Host discovery for elastic pre-training (horovodrun --host-discovery-script, run every second):
# prints the live hosts, one `host:slots` per line, read from a file of live hosts.
#
#   horovodrun -np 3 --min-np 2 --max-np 4 --gloo --network-interface eth0 \
#       --host-discovery-script "scripts/discover_hosts.sh /shared/hosts.live" python run/pretrain.py --elastic ...
#
# FILE holds `host:slots` or `host slots=N` lines (a hostfile works); blank lines and # comments are
# skipped. Whatever knows which nodes are alive keeps it current: the emulated cluster's tests, a
# health checker, or a cron job writing one of these listings (4 GPUs per node here):
#   Slurm allocation:   scontrol show hostnames "$SLURM_JOB_NODELIST" | sed 's/$/:4/'
#   GCP instance group: gcloud compute instance-groups managed list-instances GROUP --zone ZONE \
#                         --filter='instanceStatus=RUNNING' --format='value(instance.basename())' | sed 's/$/:4/'
#   AWS Auto Scaling:   aws ec2 describe-instances --filters Name=tag:aws:autoscaling:groupName,Values=GROUP \
#                         Name=instance-state-name,Values=running --query 'Reservations[].Instances[].PrivateDnsName' \
#                         --output text | tr '\t' '\n' | sed 's/$/:4/'
# A missing file or a line that is not a host fails with a message naming the file and line: at
# start-up horovodrun stops; later, Horovod warns and keeps the hosts it had until the file is fixed.
set -euo pipefail
file="${1:-${BERT_TF_HOSTS_FILE:-}}"
if [ -z "$file" ]; then
  echo "discover_hosts.sh: give the live-hosts file as the argument (or BERT_TF_HOSTS_FILE)" >&2
  exit 2
fi
if [ ! -r "$file" ]; then
  echo "discover_hosts.sh: cannot read the live-hosts file $file" >&2
  exit 2
fi
n=0
while IFS= read -r line || [ -n "$line" ]; do
  n=$((n + 1))
  line="${line%%#*}"
  line="$(echo "$line" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//')"
  [ -z "$line" ] && continue
  if [[ "$line" =~ ^([A-Za-z0-9][A-Za-z0-9._-]*)(:([1-9][0-9]*)|[[:space:]]+slots=([1-9][0-9]*))?$ ]]; then
    echo "${BASH_REMATCH[1]}:${BASH_REMATCH[3]:-${BASH_REMATCH[4]:-1}}"
  else
    echo "discover_hosts.sh: $file line $n is not 'host:slots' or 'host slots=N': $line" >&2
    exit 3
  fi
done < "$file"
