#!/usr/bin/env bash
# Makes sure the broker services the tests need answer on loopback, starting
# (and, where the binary is missing, installing) them when they do not.
# Sourced by scripts/test.sh; the commands are those of the machines'
# services.md. Only loopback addresses, ever.

# True when something accepts connections on 127.0.0.1:$1.
port_open() { timeout 1 bash -c "</dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# Waits up to $2 seconds for port $1; fails loudly naming $3.
wait_port() {
  local port=$1 secs=$2 name=$3
  for ((i = 0; i < secs * 10; i++)); do
    port_open "$port" && return 0
    sleep 0.1
  done
  echo "$name did not come up on 127.0.0.1:$port within ${secs}s" >&2
  return 1
}

apt_install() {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

ensure_nats() {
  if [ -n "${RUSTSTREAM_NATS_URL:-}" ]; then
    return 0 # the caller points the tests at a server of its own
  fi
  port_open 4222 && return 0
  echo "NATS is down on 127.0.0.1:4222: starting it"
  command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || apt_install nats-server
  local bin
  bin=$(command -v nats-server || echo /usr/sbin/nats-server)
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec "$bin" -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_port 4222 20 nats-server
}

ensure_redis() {
  if [ -n "${RUSTSTREAM_REDIS_URL:-}" ]; then
    return 0
  fi
  port_open 6379 && return 0
  echo "Redis is down on 127.0.0.1:6379: starting it"
  command -v redis-server >/dev/null || apt_install redis-server
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_port 6379 20 redis-server
}

ensure_rabbitmq() {
  if [ -n "${RUSTSTREAM_AMQP_URL:-}" ]; then
    return 0
  fi
  port_open 5672 && return 0
  echo "RabbitMQ is down on 127.0.0.1:5672: starting it (loopback only)"
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  local conf=/tmp/ruststream-rabbitmq.conf
  printf 'listeners.tcp.default = 127.0.0.1:5672\ndistribution.listener.interface = 127.0.0.1\n' >"$conf"
  ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_CONFIG_FILE=$conf rabbitmq-server -detached
  wait_port 5672 60 rabbitmq-server
}

ensure_mosquitto() {
  if [ -n "${RUSTSTREAM_MQTT_URL:-}" ]; then
    return 0
  fi
  port_open 1883 && return 0
  echo "Mosquitto is down on 127.0.0.1:1883: starting it"
  command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || apt_install mosquitto
  local bin
  bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)
  if [ -f /etc/mosquitto/mosquitto.conf ] && grep -q '^listener 1883 127.0.0.1' /etc/mosquitto/mosquitto.conf; then
    mkdir -p /run/mosquitto /var/lib/mosquitto /var/log/mosquitto
    chown mosquitto: /run/mosquitto /var/lib/mosquitto /var/log/mosquitto 2>/dev/null || true
    "$bin" -d -c /etc/mosquitto/mosquitto.conf
  else
    # Loopback only, whatever the packaged config says.
    local conf=/tmp/ruststream-mosquitto.conf
    printf 'listener 1883 127.0.0.1\nallow_anonymous true\n' >"$conf"
    "$bin" -d -c "$conf"
  fi
  wait_port 1883 20 mosquitto
}

# The Kafka binding builds librdkafka from the source its crate ships (its
# own configure and make, about a minute on two cores): it needs a C
# compiler, make, pkg-config and OpenSSL's headers. Its tests and example
# run on librdkafka's mock cluster, inside the test process: no Kafka
# server to start.
ensure_kafka_build() {
  local missing=()
  command -v cc >/dev/null || missing+=(gcc libc6-dev)
  command -v make >/dev/null || missing+=(make)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing what librdkafka's build needs: ${missing[*]}"
    apt_install "${missing[@]}"
  fi
}
