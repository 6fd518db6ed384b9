#!/usr/bin/env bash
# The README is a front door and docs/ the manual: the README stays short and shows the two
# quick-start commands; neither points outside the repository; every relative link resolves.
# Usage: check_docs.sh REPOSITORY_ROOT
set -euo pipefail
root="$1"
cd "$root"
fail=0
say() { echo "check_docs: $*" >&2; fail=1; }

lines=$(wc -l < README.md)
[ "$lines" -le 250 ] || say "README.md has $lines lines (at most 250: the manual belongs in docs/)"
for cmd in './run demo' './run test'; do
  grep -qF "$cmd" README.md || say "README.md does not show $cmd"
done
if grep -nE '\.\./shared|DESIGN\.md|REFERENCES\.md|STYLE\.md' README.md docs/*.md; then
  say "README.md or docs/ point at files outside the repository (above)"
fi
# Relative links: [text](path) and [text](path#anchor), not URLs.
for f in README.md docs/*.md; do
  dir=$(dirname "$f")
  while IFS= read -r target; do
    path="${target%%#*}"
    [ -z "$path" ] && continue
    case "$path" in http://* | https://* | mailto:*) continue ;; esac
    [ -e "$dir/$path" ] || say "$f links to $target, which does not exist"
  done < <(grep -oE '\]\([^) ]+\)' "$f" | sed -E 's/^\]\((.*)\)$/\1/')
done
# Prometheus and Alertmanager as the docs start them, run literally from a checkout: loopback
# only (their defaults listen on every interface) and their data outside the working directory
# (their default is ./data); Alertmanager alone, without its cluster port.
commands=$(for f in docs/*.md dashboards/prometheus/prometheus.yml \
             dashboards/alertmanager/alertmanager.yml; do
  sed -e 's/^#  *//' -e ':a' -e '/\\$/N; s/\\\n[# ]*//; ta' "$f" |
    grep -E '^(prometheus|prometheus-alertmanager) --config\.file' | sed "s|^|$f: |"
done)
[ -n "$commands" ] || say "no prometheus or prometheus-alertmanager command found in docs/"
while IFS= read -r line; do
  [ -z "$line" ] && continue
  case "$line" in
    *": prometheus-alertmanager "*)
      for flag in '--web.listen-address=127.0.0.1:' '--storage.path=' '--cluster.listen-address= '; do
        case "$line " in *"$flag"*) ;; *) say "${line%%:*}: Alertmanager without $flag: ${line#*: }" ;; esac
      done ;;
    *)
      for flag in '--web.listen-address=127.0.0.1:' '--storage.tsdb.path='; do
        case "$line" in *"$flag"*) ;; *) say "${line%%:*}: Prometheus without $flag: ${line#*: }" ;; esac
      done ;;
  esac
  case "$line" in *'path=./'* | *'path=data'*) say "${line%%:*}: data in the working directory: ${line#*: }" ;; esac
done <<< "$commands"

[ "$fail" -eq 0 ] && echo "check_docs: README.md ($lines lines) and docs/ are in order"
exit "$fail"
