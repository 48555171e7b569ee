// client.mjs runs the official OpenAI Node SDK (npm package "openai") against proxy
// instances and prints, as one JSON object on stdout, exactly what the SDK handed to its
// caller: the e2e test (sdk_node_test.go) compares it with what the fake upstream sent.
//
// Usage: node client.mjs '{"bases":["http://127.0.0.1:PORT/v1",...],"apiKey":"sk-...","model":"m","perBase":2}'
//
// For each kind (chat, streamed chat with usage, embeddings) it sends perBase identical
// requests to every base URL at once, with no retries of the SDK's own; the chat requests
// do not sample (temperature 0), so that one sent after the call ended is a hit.
import OpenAI from "openai";

const cfg = JSON.parse(process.argv[2]);
const clients = [];
for (const baseURL of cfg.bases) {
  for (let i = 0; i < cfg.perBase; i++) {
    clients.push(new OpenAI({ baseURL, apiKey: cfg.apiKey, maxRetries: 0, timeout: 20000 }));
  }
}

function headers(response) {
  return {
    role: response.headers.get("x-dedupe-role"),
    requestId: response.headers.get("x-request-id"),
  };
}

async function chat(client) {
  const { data, response } = await client.chat.completions
    .create({ model: cfg.model, temperature: 0, messages: [{ role: "user", content: "Say hi from the Node SDK" }] })
    .withResponse();
  return { raw: JSON.stringify(data), id: data.id, content: data.choices[0].message.content, usage: data.usage, ...headers(response) };
}

async function stream(client) {
  const { data, response } = await client.chat.completions
    .create({
      model: cfg.model,
      temperature: 0,
      messages: [{ role: "user", content: "Stream hi from the Node SDK" }],
      stream: true,
      stream_options: { include_usage: true },
    })
    .withResponse();
  const chunks = [];
  let content = "";
  let usage = null;
  for await (const chunk of data) {
    chunks.push(JSON.stringify(chunk));
    content += chunk.choices[0]?.delta?.content ?? "";
    if (chunk.usage) usage = chunk.usage;
  }
  return { chunks, content, usage, ...headers(response) };
}

async function embed(client) {
  const { data, response } = await client.embeddings
    .create({ model: cfg.model, input: "embed me", encoding_format: "float" })
    .withResponse();
  return { raw: JSON.stringify(data), embedding: data.data[0].embedding, usage: data.usage, ...headers(response) };
}

const out = {};
for (const [name, fn] of [["chat", chat], ["stream", stream], ["embeddings", embed]]) {
  out[name] = await Promise.all(clients.map(fn));
}
process.stdout.write(JSON.stringify(out) + "\n");
