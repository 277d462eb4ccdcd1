#!/usr/bin/env bash
# Fetch the Apache Kafka broker jars (and their runtime dependencies) named in
# bench/kafka/pom.xml into .tools/kafka-lib, for bench/kafka_ref.py and
# `bench/produce_bench.py --kafka`. Needs mvn and a JDK 17+.
set -euo pipefail
cd "$(dirname "$0")/../.."
mvn -q -B -f bench/kafka/pom.xml dependency:copy-dependencies
ls .tools/kafka-lib/kafka_2.13-*.jar
