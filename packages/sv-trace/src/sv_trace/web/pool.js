// The page pool as a grid of cells, one per page: coloured by the request that holds it,
// outlined when shared by several block tables, hatched when cached (held by nobody, keeping
// prefix-cache KV). Shared by the trace report and the server's live dashboard.
"use strict";

function requestColor(id) {
  // Golden-angle hues: neighbouring request ids get far-apart colours.
  return "hsl(" + ((id * 137.508) % 360).toFixed(1) + ", 62%, 52%)";
}

function drawPool(container, pool) {
  const owners = new Array(pool.num_pages).fill(null);
  const holders = new Array(pool.num_pages).fill(0);
  const rows = new Array(pool.num_pages).fill(null);
  for (const table of pool.tables) {
    const released = table.released || 0; // a sliding window's pages given back before these
    table.pages.forEach(function (page, index) {
      if (owners[page] === null) {
        owners[page] = table.request;
        rows[page] = released + index;
      }
      holders[page] += 1;
    });
  }
  const cached = new Set(pool.cached_pages);
  container.classList.toggle("large", pool.num_pages <= 400); // a small pool: bigger cells
  let cells = container.children;
  if (cells.length !== pool.num_pages) {
    container.textContent = "";
    for (let page = 0; page < pool.num_pages; page++) {
      const cell = document.createElement("div");
      cell.className = "page";
      cell.dataset.page = String(page);
      container.appendChild(cell);
    }
    cells = container.children;
  }
  for (let page = 0; page < pool.num_pages; page++) {
    const cell = cells[page];
    const owner = owners[page];
    let state = "free";
    let title = "page " + page + ": free";
    if (owner !== null) {
      state = holders[page] > 1 ? "shared" : "assigned";
      title = "page " + page + ": request " + owner + ", its page " + rows[page] +
        (holders[page] > 1 ? " (shared by " + holders[page] + " requests)" : "");
      cell.style.background = requestColor(owner);
      cell.dataset.request = String(owner);
    } else {
      if (cached.has(page)) {
        state = "cached";
        title = "page " + page + ": cached (prefix-cache KV, held by nobody)";
      }
      cell.style.background = "";
      delete cell.dataset.request;
    }
    cell.className = "page " + state;
    cell.title = title;
  }
}
