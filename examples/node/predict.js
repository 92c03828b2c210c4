#!/usr/bin/env node
// Assign the rows of a .npy batch to the clusters of a qkm ONNX model (qkm.export.to_onnx / `qkm export`).
//
//   node predict.js MODEL.onnx BATCH.npy [--json] [--threads N]
//
// BATCH.npy: a 2-D float32 array (numpy: np.save("batch.npy", X.astype(np.float32))), C order.
// Output: one label per line (the index of the closest centroid), or with --json one object
// {"labels": [...], "distances": [...]} (distances = squared Euclidean distance to that centroid).
// Exit codes: 0 ok, 2 bad usage or input, 1 model / runtime error.
"use strict";

const fs = require("fs");
const os = require("os");

class InputError extends Error {}

// ---------------------------------------------------------------------------
// .npy reader (format versions 1.0, 2.0, 3.0; https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html)
// ---------------------------------------------------------------------------
const MAGIC = Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]); // \x93NUMPY

function parseHeader(text) {
  // The header is a Python dict literal, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (3, 784), }
  const descr = /['"]descr['"]\s*:\s*['"]([^'"]+)['"]/.exec(text);
  const fortran = /['"]fortran_order['"]\s*:\s*(True|False)/.exec(text);
  const shape = /['"]shape['"]\s*:\s*\(([^)]*)\)/.exec(text);
  if (!descr || !fortran || !shape) {
    throw new InputError(`unreadable .npy header: ${text.trim()}`);
  }
  const dims = shape[1].split(",").map((s) => s.trim()).filter((s) => s.length > 0).map(Number);
  if (dims.some((d) => !Number.isInteger(d) || d < 0)) {
    throw new InputError(`bad shape in .npy header: (${shape[1]})`);
  }
  return { descr: descr[1], fortranOrder: fortran[1] === "True", shape: dims };
}

function readNpy(path) {
  let buf;
  try {
    buf = fs.readFileSync(path);
  } catch (err) {
    throw new InputError(`cannot read ${path}: ${err.message}`);
  }
  if (buf.length < 10 || !buf.subarray(0, 6).equals(MAGIC)) {
    throw new InputError(`${path} is not a .npy file (no \\x93NUMPY magic)`);
  }
  const major = buf[6];
  let headerLen;
  let offset;
  if (major === 1) {
    headerLen = buf.readUInt16LE(8);
    offset = 10;
  } else if (major === 2 || major === 3) {
    if (buf.length < 12) throw new InputError(`${path}: truncated .npy header`);
    headerLen = buf.readUInt32LE(8);
    offset = 12;
  } else {
    throw new InputError(`${path}: unsupported .npy format version ${major}.${buf[7]}`);
  }
  if (buf.length < offset + headerLen) throw new InputError(`${path}: truncated .npy header`);
  const header = parseHeader(buf.toString(major === 3 ? "utf8" : "latin1", offset, offset + headerLen));
  const dataStart = offset + headerLen;

  if (header.descr !== "<f4" && !(header.descr === "=f4" && os.endianness() === "LE")) {
    throw new InputError(
      `${path}: dtype ${header.descr} is not supported; expected little-endian float32 ('<f4'). ` +
        "Convert with np.save(path, X.astype('<f4')).");
  }
  if (header.fortranOrder) {
    throw new InputError(
      `${path}: the array is in Fortran (column-major) order; save a C-ordered copy: ` +
        "np.save(path, np.ascontiguousarray(X)).");
  }
  if (header.shape.length !== 2) {
    throw new InputError(`${path}: expected a 2-D array (rows x features), got shape (${header.shape.join(", ")})`);
  }
  const [rows, cols] = header.shape;
  const nbytes = rows * cols * 4;
  if (buf.length - dataStart !== nbytes) {
    throw new InputError(
      `${path}: ${buf.length - dataStart} data bytes for shape (${rows}, ${cols}) float32; expected ${nbytes} ` +
        "(truncated or corrupt file)");
  }
  const data = new Float32Array(rows * cols);
  if (os.endianness() === "LE") {
    // copy: the Buffer's byte offset need not be 4-byte aligned
    new Uint8Array(data.buffer).set(buf.subarray(dataStart, dataStart + nbytes));
  } else {
    for (let i = 0; i < data.length; i++) data[i] = buf.readFloatLE(dataStart + 4 * i);
  }
  return { data, rows, cols };
}

// ---------------------------------------------------------------------------
function usage(message) {
  if (message) process.stderr.write(`error: ${message}\n`);
  process.stderr.write("usage: node predict.js MODEL.onnx BATCH.npy [--json] [--threads N]\n");
  process.exit(2);
}

function badInput(message) {
  process.stderr.write(`error: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { json: false, threads: 1, positional: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--json") opts.json = true;
    else if (a === "--threads") {
      opts.threads = Number(argv[++i]);
      if (!Number.isInteger(opts.threads) || opts.threads < 1) usage("--threads needs a positive integer");
    } else if (a === "-h" || a === "--help") usage();
    else if (a.startsWith("--")) usage(`unknown option ${a}`);
    else opts.positional.push(a);
  }
  if (opts.positional.length !== 2) usage("expected MODEL.onnx and BATCH.npy");
  return opts;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const [modelPath, npyPath] = opts.positional;
  let batch;
  try {
    batch = readNpy(npyPath);
  } catch (err) {
    if (err instanceof InputError) badInput(err.message);
    throw err;
  }
  const ort = require("onnxruntime-node");
  const session = await ort.InferenceSession.create(modelPath, {
    executionProviders: ["cpu"],
    graphOptimizationLevel: "all", // the sparse / hybrid encodings rely on constant folding at load
    intraOpNumThreads: opts.threads,
    interOpNumThreads: 1,
  });
  if (!session.inputNames.includes("X") || !session.outputNames.includes("label")) {
    throw new Error(`${modelPath}: not a qkm model (inputs ${session.inputNames}, outputs ${session.outputNames})`);
  }
  const X = new ort.Tensor("float32", batch.data, [batch.rows, batch.cols]);
  let out;
  try {
    out = await session.run({ X }, ["label", "distance"]);
  } catch (err) {
    throw new Error(`the model rejected a (${batch.rows}, ${batch.cols}) batch: ${err.message}`);
  }
  const labels = Array.from(out.label.data, (v) => Number(v)); // int64 -> BigInt64Array
  if (opts.json) {
    const distances = Array.from(out.distance.data);
    process.stdout.write(JSON.stringify({ labels, distances }) + "\n");
  } else {
    process.stdout.write(labels.length ? labels.join("\n") + "\n" : "");
  }
}

if (require.main === module) {
  main().catch((err) => {
    process.stderr.write(`error: ${err.message}\n`);
    process.exit(1);
  });
}

module.exports = { readNpy, parseHeader, InputError };
