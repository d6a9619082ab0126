// A test MCP Apps host page: the official host bridge (AppBridge from
// @modelcontextprotocol/ext-apps) with the view in a sandboxed srcdoc iframe, every tools/call
// forwarded to the real mcqemu through the page's `hostCallTool` binding. Bundled by esbuild.
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

window.__context = [];
window.startHost = async (html) => {
  const iframe = document.createElement("iframe");
  iframe.setAttribute("sandbox", "allow-scripts");
  iframe.style.width = "900px";
  iframe.style.height = "700px";
  document.body.appendChild(iframe);
  const bridge = new AppBridge(
    null,
    { name: "mcqemu-test-host", version: "1.0.0" },
    { serverTools: {}, updateModelContext: { text: {} } },
    { hostContext: { theme: "light", displayMode: "inline" } },
  );
  bridge.oncalltool = async (params) => JSON.parse(await window.hostCallTool(JSON.stringify(params)));
  bridge.onupdatemodelcontext = async (params) => {
    window.__context.push(params);
    return {};
  };
  bridge.oninitialized = () => { window.__initialized = true; };
  await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
  iframe.srcdoc = html;
  window.__bridge = bridge;
};
window.sendTool = async (name) => {
  await window.__bridge.sendToolInput({ arguments: { name } });
  await window.__bridge.sendToolResult({
    content: [{ type: "text", text: JSON.stringify({ name }) }],
    structuredContent: { name, view: "ui://mcqemu/view" },
  });
};
window.teardown = () => window.__bridge.teardownResource({});
