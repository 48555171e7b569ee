// retry.mjs sends one chat request with the official OpenAI Node SDK (npm package "openai"),
// whose first try times out, and lets the SDK retry it as it does by itself: the e2e test
// (sampled_test.go) checks that the retry is served the answer of the call its first try
// started. It prints, as one JSON object on stdout, what the SDK handed to its caller and
// every try it sent, with when the SDK sent it (before the gate).
//
// Usage: node retry.mjs '{"bases":["http://127.0.0.1:A/v1","http://127.0.0.1:B/v1"],
//   "apiKey":"sk-...","model":"m","prompt":"p","timeoutMs":1000,"gate":"http://127.0.0.1:G/"}'
//
// Each try goes to the next base URL, as a load balancer may send it; before a retry the
// script waits for the gate (an HTTP GET that answers when the test lets the retry go).
import OpenAI from "openai";

const cfg = JSON.parse(process.argv[2]);
const tries = [];
const start = Date.now();

async function fetchTry(url, init) {
  const instance = tries.length % cfg.bases.length;
  const retryCount = new Headers(init.headers).get("x-stainless-retry-count");
  tries.push({ instance, retryCount, atMs: Date.now() - start });
  if (retryCount !== "0") {
    await (await fetch(cfg.gate)).text();
  }
  return fetch(String(url).replace(cfg.bases[0], cfg.bases[instance]), init);
}

const client = new OpenAI({
  baseURL: cfg.bases[0],
  apiKey: cfg.apiKey,
  timeout: cfg.timeoutMs,
  maxRetries: 2,
  fetch: fetchTry,
});
const { data, response } = await client.chat.completions
  .create({ model: cfg.model, messages: [{ role: "user", content: cfg.prompt }] })
  .withResponse();
console.log(
  JSON.stringify({
    content: data.choices[0].message.content,
    role: response.headers.get("x-dedupe-role"),
    sampled: response.headers.get("x-dedupe-sampled"),
    tries,
  }),
);
