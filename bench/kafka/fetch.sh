#!/usr/bin/env bash
# Fetch the Apache Kafka broker and kafka-tools jars (and their runtime
# dependencies) named in bench/kafka/pom.xml into .tools/kafka-lib, for
# bench/kafka_ref.py, `bench/produce_bench.py --kafka` and
# tests/test_kafka_tools.py. Needs mvn and a JDK 17+.
set -euo pipefail
cd "$(dirname "$0")/../.."
mvn -q -B -f bench/kafka/pom.xml dependency:copy-dependencies
ls .tools/kafka-lib/kafka_2.13-*.jar
