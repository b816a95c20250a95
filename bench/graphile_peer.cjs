// graphile-worker's side of `python -m bench --peers`: runs under Node with the modules
// npm installed into bench/.peers/graphile-worker-<version>/ (NODE_PATH), never in the
// project. No Django here.
//   node graphile_peer.cjs install           # its own schema (runMigrations)
//   node graphile_peer.cjs run               # its worker, as users run it (`run`)
//   node graphile_peer.cjs trickle N GAP_S   # N single enqueues, one every GAP_S seconds
// The connection string comes from DATABASE_URL (graphile-worker's own variable); stamps
// of the `stamp` task go to the file $PEER_STAMPS ("job_id wall_clock" per line), commit
// times of `trickle` to stdout as {job id: wall clock}.
"use strict";

const fs = require("node:fs");
const { run, runMigrations } = require("graphile-worker");
const { Client } = require("pg");

const connectionString = process.env.DATABASE_URL;

// Wall-clock seconds with the microseconds Date.now() drops (it counts whole ms).
function now() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

async function install() {
  await runMigrations({ connectionString, logger: quiet() });
}

async function work() {
  const stamps = process.env.PEER_STAMPS
    ? fs.openSync(process.env.PEER_STAMPS, "a")
    : null;
  const runner = await run({
    connectionString,
    // Its defaults (one job at a time, a 2 s poll beside LISTEN), as its users start it.
    logger: quiet(),
    taskList: {
      // Nothing at all but the stamp: the queue's own cost.
      stamp: async (payload, helpers) => {
        const started = now();
        if (stamps !== null) {
          fs.writeSync(stamps, `${helpers.job.id} ${started}\n`);
        }
      },
    },
  });
  await runner.promise;
}

async function trickle(n, gapS) {
  // Each add_job its own transaction: pg outside BEGIN autocommits.
  const client = new Client({ connectionString });
  await client.connect();
  const committed = {};
  try {
    for (let i = 0; i < n; i += 1) {
      const { rows } = await client.query(
        "SELECT (graphile_worker.add_job('stamp', '{}'::json)).id AS id",
      );
      committed[rows[0].id] = now();
      await new Promise((resolve) => setTimeout(resolve, gapS * 1000));
    }
  } finally {
    await client.end();
  }
  process.stdout.write(JSON.stringify(committed));
}

function quiet() {
  const { Logger } = require("graphile-worker");
  return new Logger(() => (level, message) => {
    if (level === "error") process.stderr.write(`${message}\n`);
  });
}

async function main([command, ...args]) {
  if (command === "install") return install();
  if (command === "run") return work();
  if (command === "trickle") return trickle(Number(args[0]), Number(args[1]));
  throw new Error(`unknown command ${command}`);
}

main(process.argv.slice(2)).catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
