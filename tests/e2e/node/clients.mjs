// The Node.js clients people use, against the service (SERVICEAI_BASE_URL, SERVICEAI_API_KEY):
// the Vercel AI SDK's forced tool calls and generateObject, and the official openai client's
// structured outputs and forced calls, whole and streamed, through JSON.parse. Prints one JSON
// line: {"checks": n, "failures": [...]}; run by tests/e2e/test_node_clients.py.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, jsonSchema, tool } from "ai";
import OpenAI from "openai";
import { z } from "zod";

const baseURL = process.env.SERVICEAI_BASE_URL;
const apiKey = process.env.SERVICEAI_API_KEY;
const ROUNDS = Number(process.env.SERVICEAI_NODE_ROUNDS || "6");
const MODEL = "ServiceAi-Fast";
const SCHEMA = {
  type: "object",
  properties: {
    city: { type: "string", maxLength: 12 },
    code: { type: "string", minLength: 1, maxLength: 4 },
    days: { type: "integer", minimum: 1, maximum: 7 },
  },
  required: ["city", "code", "days"],
  additionalProperties: false,
};
const Weather = z.object({
  city: z.string().max(12),
  code: z.string().min(1).max(4),
  days: z.number().int().min(1).max(7),
});

const failures = [];
let checks = 0;

async function check(name, run) {
  checks += 1;
  try {
    await run();
  } catch (error) {
    failures.push(`${name}: ${error.name}: ${String(error.message).slice(0, 400)}`);
  }
}

function parsed(text) {
  let value;
  try {
    value = JSON.parse(text); // strict: a raw control character in a string throws
  } catch (error) {
    throw new SyntaxError(`${error.message}: ${JSON.stringify(text)}`);
  }
  Weather.parse(value);
  return value;
}

// The service enforces json_schema (the SDK otherwise sends json_object and only describes the schema).
const provider = createOpenAICompatible({ name: "serviceai", baseURL, apiKey, supportsStructuredOutputs: true });
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const messages = [{ role: "user", content: "The weather in Paris, please." }];

for (let seed = 0; seed < ROUNDS; seed += 1) {
  await check(`ai generateText toolChoice required, seed ${seed}`, async () => {
    const result = await generateText({
      model: provider(MODEL),
      prompt: "The weather in Paris, please.",
      tools: { get_weather: tool({ description: "The forecast.", inputSchema: jsonSchema(SCHEMA) }) },
      toolChoice: "required",
      seed,
      maxOutputTokens: 200,
      providerOptions: { serviceai: { parallel_tool_calls: false } },
    });
    if (result.finishReason === "length") return; // cut: promises nothing but its reason
    if (result.toolCalls.length !== 1) throw new Error(`${result.toolCalls.length} tool calls`);
    Weather.parse(result.toolCalls[0].input);
  });
  await check(`ai generateObject, seed ${seed}`, async () => {
    const result = await generateObject({
      model: provider(MODEL), schema: Weather, prompt: "The weather in Paris.", seed,
      maxOutputTokens: 200,
    });
    Weather.parse(result.object);
  });
  await check(`openai json_schema, seed ${seed}`, async () => {
    const reply = await client.chat.completions.create({
      model: MODEL, messages, seed, max_tokens: 200,
      response_format: { type: "json_schema", json_schema: { name: "w", schema: SCHEMA, strict: true } },
    });
    if (reply.choices[0].finish_reason === "stop") parsed(reply.choices[0].message.content);
  });
  await check(`openai json_schema streamed, seed ${seed}`, async () => {
    const stream = await client.chat.completions.create({
      model: MODEL, messages, seed, max_tokens: 200, stream: true,
      response_format: { type: "json_schema", json_schema: { name: "w", schema: SCHEMA, strict: true } },
    });
    let text = "";
    let finish = null;
    for await (const chunk of stream) {
      if (!chunk.choices.length) continue;
      text += chunk.choices[0].delta.content || "";
      finish = chunk.choices[0].finish_reason || finish;
    }
    if (finish === "stop") parsed(text);
  });
  await check(`openai forced named call streamed, seed ${seed}`, async () => {
    const stream = await client.chat.completions.create({
      model: MODEL, messages, seed, max_tokens: 200, stream: true,
      tools: [{ type: "function", function: { name: "get_weather", parameters: SCHEMA } }],
      tool_choice: { type: "function", function: { name: "get_weather" } },
    });
    let args = "";
    let finish = null;
    for await (const chunk of stream) {
      if (!chunk.choices.length) continue;
      for (const call of chunk.choices[0].delta.tool_calls || []) args += call.function?.arguments || "";
      finish = chunk.choices[0].finish_reason || finish;
    }
    if (finish !== "length") parsed(args);
  });
}

console.log(JSON.stringify({ checks, failures }));
process.exit(failures.length ? 1 : 0);
