// The reference side of the tokenizer parity tests: Hugging Face's pure-JS tokenizers
// (@huggingface/tokenizers from the npm registry) encoding files with a tokenizer.json.
//
//   node hf_tokenize.mjs MODULE.mjs TOKENIZER_DIR LIST
//
// MODULE.mjs: the package's dist/tokenizers.mjs; TOKENIZER_DIR: tokenizer.json and, when
// present, tokenizer_config.json; LIST: one input file per line. Each file's bytes are read as
// UTF-8 the WHATWG way (an invalid sequence becomes U+FFFD) and encoded without special tokens;
// prints one JSON array of ids per input, in order.
import { readFileSync, existsSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [modulePath, dir, list] = process.argv.slice(2);
const { Tokenizer } = await import(pathToFileURL(modulePath).href);
const json = JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8"));
const cfgPath = `${dir}/tokenizer_config.json`;
const cfg = existsSync(cfgPath) ? JSON.parse(readFileSync(cfgPath, "utf8")) : {};
const tok = new Tokenizer(json, cfg);
const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const out = [];
for (const path of readFileSync(list, "utf8").split("\n").filter((l) => l.length > 0)) {
  const text = decoder.decode(readFileSync(path));
  out.push(JSON.stringify(tok.encode(text, { add_special_tokens: false }).ids));
}
process.stdout.write(out.join("\n") + "\n");
