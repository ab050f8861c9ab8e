#!/bin/sh
# expect_refusal.sh CODE PATTERN COMMAND [ARG...]: passes when COMMAND exits with CODE and prints
# exactly one line, which matches PATTERN (a grep -E expression). How the CLI tests check that a
# stage refuses what it cannot run with one clear line.
code=$1
pattern=$2
shift 2
output=$("$@" 2>&1)
status=$?
lines=$(printf '%s\n' "$output" | grep -c .)
printf '%s\n' "$output"
[ "$status" -eq "$code" ] || { echo "expect_refusal: exit code $status, wanted $code"; exit 1; }
[ "$lines" -eq 1 ] || { echo "expect_refusal: $lines lines of output, wanted one"; exit 1; }
printf '%s\n' "$output" | grep -Eq -- "$pattern" || { echo "expect_refusal: the line does not match '$pattern'"; exit 1; }
