// Validates AsyncAPI documents (JSON or YAML files) with the official
// parser. Exits 1 with the parser's diagnostics when one has an error.
// Usage: node validate.mjs FILE...
import { readFile } from 'node:fs/promises';
import { Parser } from '@asyncapi/parser';

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error('usage: node validate.mjs FILE...');
  process.exit(2);
}
const parser = new Parser();
let failed = false;
for (const file of files) {
  const source = await readFile(file, 'utf8');
  const { document, diagnostics } = await parser.parse(source);
  // Severity 0 is an error; 1-3 are warnings, information and hints.
  const errors = diagnostics.filter((d) => d.severity === 0);
  for (const d of diagnostics) {
    const where = d.path && d.path.length ? d.path.join('.') : '(document)';
    const level = ['error', 'warning', 'info', 'hint'][d.severity] ?? d.severity;
    console.error(`${file}: ${level} ${d.code} at ${where}: ${d.message}`);
  }
  if (!document || errors.length > 0) {
    failed = true;
    console.error(`${file}: INVALID (${errors.length} error(s))`);
  } else {
    const version = document.version();
    const operations = document.operations().length;
    const channels = document.channels().length;
    console.log(`${file}: valid AsyncAPI ${version} (${channels} channels, ${operations} operations)`);
  }
}
process.exit(failed ? 1 : 0);
