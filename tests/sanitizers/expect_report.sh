#!/usr/bin/env bash
# Runs the sanitizer canary in one mode and passes only when the sanitizer stopped
# it: a failure exit status, the sanitizer's report naming the bug, and (when given)
# none of FORBIDDEN, text the program prints only if it ran on past the bug.
#   expect_report.sh CANARY MODE REPORT_REGEX [FORBIDDEN_REGEX]
set -uo pipefail
canary=$1 mode=$2 report=$3 forbidden=${4:-}

output=$("$canary" "$mode" 2>&1)
status=$?
echo "$output"
if ((status == 0)); then
  echo "expect_report: '$mode' exited 0: the sanitizer did not stop the bug" >&2
  exit 1
fi
if ! grep -Eq "$report" <<<"$output"; then
  echo "expect_report: '$mode' exited $status without the expected report /$report/" >&2
  exit 1
fi
if [[ -n $forbidden ]] && grep -Eq "$forbidden" <<<"$output"; then
  echo "expect_report: '$mode' went on past the bug (printed /$forbidden/)" >&2
  exit 1
fi
echo "expect_report: '$mode' stopped with status $status and the expected report"
