/* Backprop by Hand: three things a reader needs that the theme does not do.
   Jupyter Book adds every .js file in _static/ to every page (no entry in _config.yml).

   1. Figures at full size.  A notebook figure (div.cell_output img) or an animation's frame
      wider than the text column is shown scaled down: on a 390 px phone chapter 1's graph at
      0.37 of its size, its labels 3-4 px.  Such an image gets a zoom-in cursor and a
      "Full size" button under it; a tap (or Enter) opens it in an overlay at 1 image px per
      CSS px, where the reader scrolls or pinches, and × or Escape closes it.  An animation
      keeps its controls: ‹ and › in the overlay step the animation on the page, and the
      overlay follows its frame.  tests/test_site.py opens every figure of every chapter at
      390 px and checks the size; tests/test_figures.py checks that the figures' text is
      at least 9 px at that size.
   2. The page's drawers close when one of their links is followed.  pydata-sphinx-theme
      opens the Contents (☷) and chapter (☰) drawers as modal dialogs and leaves them open
      after a tap on a link, covering the section the reader asked for.
   3. The language switch lands on the section the reader is in, in the other edition.
   4. Search finds Chinese words in body text, and its snippets show formulas as text, not TeX.
   The words it adds to a page are in the page's language (WORDS). */
(function () {
  "use strict";

  const FIGURES = "main div.cell_output img, main div.animation img";

  // The words this script adds to a page, in the page's language (the Chinese edition sets
  // <html lang="zh-CN">); tests/test_site.py reads the Chinese ones on a Chinese page.
  const WORDS = {
    en: {
      overlay: "Figure at full size",
      previous: "Previous frame",
      next: "Next frame",
      hint: "Full size: scroll or pinch to move around",
      close: "Close the full-size figure (Escape)",
      closeTitle: "Close (Esc)",
      button: "⤢ Full size",
      buttonLabel: "Show this figure at full size",
      figure: "Figure, shown smaller than its size: show it at full size",
      figureTitle: "Show at full size",
      errata: "What the source articles got wrong",
    },
    zh: {
      overlay: "原尺寸的图",
      previous: "上一帧",
      next: "下一帧",
      hint: "原尺寸：滑动或双指缩放来查看",
      close: "关闭原尺寸的图（Esc）",
      closeTitle: "关闭（Esc）",
      button: "⤢ 原尺寸",
      buttonLabel: "以原尺寸查看这张图",
      figure: "这张图显示得比原尺寸小：点按以原尺寸查看",
      figureTitle: "以原尺寸查看",
      errata: "源文章中的错误",
    },
  };
  const T = WORDS[(document.documentElement.lang || "en").toLowerCase().startsWith("zh") ? "zh" : "en"];

  function ready(fn) {
    if (document.readyState !== "loading") fn();
    else document.addEventListener("DOMContentLoaded", fn);
  }

  /* ------------------------------------------------------------ figures at full size */

  let overlay = null;
  let shown = null; // the figure on the page that the overlay shows
  let follow = null; // MutationObserver: the overlay follows an animation's frame

  function scaledDown(img) {
    return img.naturalWidth > 0 && img.getBoundingClientRect().width < img.naturalWidth - 1;
  }

  function buildOverlay() {
    const d = document.createElement("dialog");
    d.className = "bbh-zoom";
    d.setAttribute("aria-label", T.overlay);
    d.innerHTML =
      '<div class="bbh-zoom__bar">' +
      '<span class="bbh-zoom__frames">' +
      `<button type="button" class="bbh-zoom__step" data-step="previous" aria-label="${T.previous}">‹</button>` +
      `<button type="button" class="bbh-zoom__step" data-step="next" aria-label="${T.next}">›</button>` +
      "</span>" +
      `<span class="bbh-zoom__hint">${T.hint}</span>` +
      `<button type="button" class="bbh-zoom__close" aria-label="${T.close}" title="${T.closeTitle}">×</button>` +
      "</div>" +
      '<div class="bbh-zoom__view"><img class="bbh-zoom__img" alt=""></div>';
    d.querySelector(".bbh-zoom__close").addEventListener("click", () => d.close());
    for (const b of d.querySelectorAll(".bbh-zoom__step")) {
      b.addEventListener("click", () => {
        const anim = shown && shown.closest("div.animation");
        const control = anim && anim.querySelector(`button[onclick$='${b.dataset.step}_frame()']`);
        if (control) control.click();
      });
    }
    // A tap beside the figure (on the dark backdrop or the empty view) closes it too.
    d.addEventListener("click", (e) => {
      if (e.target === d || e.target.classList.contains("bbh-zoom__view")) d.close();
    });
    d.addEventListener("close", () => {
      document.documentElement.classList.remove("bbh-zoom-open");
      if (follow) follow.disconnect();
      follow = null;
      const back = shown;
      shown = null;
      if (back) back.focus({ preventScroll: true });
    });
    document.body.appendChild(d);
    return d;
  }

  function showFrom(source) {
    const img = overlay.querySelector(".bbh-zoom__img");
    img.src = source.currentSrc || source.src;
    img.alt = source.alt && !source.alt.endsWith(".png") ? source.alt : "";
    // One image pixel per CSS pixel, whatever the page's styles say about images.
    img.style.width = source.naturalWidth + "px";
  }

  function open(source) {
    overlay = overlay || buildOverlay();
    shown = source;
    showFrom(source);
    const animated = !!source.closest("div.animation");
    overlay.querySelector(".bbh-zoom__frames").hidden = !animated;
    if (animated) {
      follow = new MutationObserver(() => showFrom(source));
      follow.observe(source, { attributes: true, attributeFilter: ["src"] });
    }
    document.documentElement.classList.add("bbh-zoom-open");
    overlay.showModal();
    overlay.querySelector(".bbh-zoom__view").scrollTo(0, 0);
    overlay.querySelector(".bbh-zoom__close").focus({ preventScroll: true });
  }

  function mark(img) {
    if (!img.bbhHint) {
      const hint = document.createElement("button");
      hint.type = "button";
      hint.className = "bbh-zoom-hint";
      hint.textContent = T.button;
      hint.setAttribute("aria-label", T.buttonLabel);
      hint.addEventListener("click", () => open(img));
      img.insertAdjacentElement("afterend", hint);
      img.bbhHint = hint;
      img.addEventListener("click", () => img.classList.contains("bbh-zoomable") && open(img));
      img.addEventListener("keydown", (e) => {
        if ((e.key === "Enter" || e.key === " ") && img.classList.contains("bbh-zoomable")) {
          e.preventDefault();
          open(img);
        }
      });
    }
    const small = scaledDown(img);
    img.classList.toggle("bbh-zoomable", small);
    img.bbhHint.hidden = !small;
    if (small) {
      img.tabIndex = 0;
      img.setAttribute("role", "button");
      img.setAttribute("aria-label", T.figure);
      img.title = T.figureTitle;
    } else {
      img.removeAttribute("tabindex");
      img.removeAttribute("role");
      img.removeAttribute("aria-label");
      img.removeAttribute("title");
    }
  }

  function markAll() {
    for (const img of document.querySelectorAll(FIGURES)) {
      if (img.complete && img.naturalWidth > 0) mark(img);
      else img.addEventListener("load", () => mark(img), { once: true });
    }
  }

  /* ------------------------------------------- drawers close when a link is followed */

  function closeDrawersOnLinks() {
    for (const id of ["pst-secondary-sidebar-modal", "pst-primary-sidebar-modal"]) {
      const drawer = document.getElementById(id);
      if (!drawer) continue;
      drawer.addEventListener("click", (e) => {
        const link = e.target.closest("a[href]");
        if (!link || !drawer.open || e.defaultPrevented) return;
        const here = link.origin === location.origin && link.pathname === location.pathname;
        const target = here && link.hash ? document.getElementById(decodeURIComponent(link.hash.slice(1))) : null;
        // Close now: the link's own navigation (the scroll to its section) runs after this
        // handler.  The theme then moves focus back to the ☷ button; put it on the section.
        drawer.close();
        if (target) {
          drawer.addEventListener(
            "close",
            () => {
              if (!target.hasAttribute("tabindex")) target.setAttribute("tabindex", "-1");
              target.focus({ preventScroll: true });
              target.scrollIntoView();
            },
            { once: true },
          );
        }
      });
    }
  }

  /* ------------------------------------- the language switch keeps the reader's place */

  // The section the reader is in: the last one whose heading is above the top third of the
  // window (headings come in document order, so their tops only grow). null at the page's top.
  function sectionInView() {
    if (window.scrollY < 40) return null;
    let here = null;
    for (const section of document.querySelectorAll("main article section[id]")) {
      const heading = section.querySelector(":scope > h1, :scope > h2, :scope > h3, :scope > h4");
      if (!heading) continue;
      if (heading.getBoundingClientRect().top > window.innerHeight / 3) break;
      here = section;
    }
    return here;
  }

  // The language switch (English / 中文) lands on the section the reader is in: both editions
  // keep the English headings' ids, so the #hash the reader followed carries over while its
  // target is on the screen, and otherwise the id of the section in view.
  function keepSectionOnLanguageSwitch() {
    for (const link of document.querySelectorAll("a[data-bbh-language-switch]")) {
      link.addEventListener("click", () => {
        const hash = window.location.hash;
        const target = hash && document.getElementById(decodeURIComponent(hash.slice(1)));
        const box = target && target.getBoundingClientRect();
        if (box && box.top < window.innerHeight && box.bottom > 0) link.hash = hash; // still in it
        else {
          const here = sectionInView();
          if (here) link.hash = "#" + here.id;
        }
      });
    }
  }

  // The notebooks' asides (<details class="bbh-errata">) carry their English title: the Chinese
  // edition translates the paragraphs inside from its catalogs, and the title here.
  function translateAsides() {
    for (const s of document.querySelectorAll("details.bbh-errata > summary")) {
      if (s.textContent.trim() === WORDS.en.errata) s.textContent = T.errata;
    }
  }

  /* ------------------------------------------------------------ search */
  // Sphinx indexes Chinese text as the words jieba cut at build time (反向, 计算), but
  // searchtools.js splits a query only at spaces and punctuation: 反向计算 was looked up as one
  // word the index does not hold, and 1 of the 14 pages that say it was found.  Each run of Han
  // characters in a query is cut here into the longest words the index holds (forward maximum
  // matching, with the index as the dictionary); a lone character no word holds is dropped, as
  // the index drops one-character words.  searchtools.js keeps a splitQuery defined before it.
  function indexed(word) {
    const index = typeof Search !== "undefined" && Search._index;
    return !!index && (Object.hasOwn(index.terms, word) || Object.hasOwn(index.titleterms, word));
  }

  function cutHan(run) {
    const words = [];
    for (let i = 0; i < run.length; ) {
      let j = run.length;
      while (j > i + 1 && !indexed(run.slice(i, j))) j--;
      if (j > i + 1 || indexed(run[i])) words.push(run.slice(i, j));
      i = j;
    }
    return words.length ? words : [run];
  }

  window.splitQuery = (query) =>
    query
      .split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu) // searchtools.js's own split
      .filter((term) => term)
      .flatMap((term) => term.match(/\p{Script=Han}+|\P{Script=Han}+/gu))
      .flatMap((part) => (/\p{Script=Han}/u.test(part) ? cutHan(part) : [part]));

  // A result's snippet is the page's text around the words found, and a formula in that text
  // was its TeX source (\(\partial L/\partial \hat y\)): MathJax typesets the page, not the
  // snippet.  Formulas are turned into plain text first (∂L/∂ŷ).
  const SYMBOLS = {
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε", zeta: "ζ",
    eta: "η", theta: "θ", kappa: "κ", lambda: "λ", mu: "μ", nu: "ν", xi: "ξ", pi: "π", rho: "ρ",
    sigma: "σ", tau: "τ", phi: "φ", varphi: "φ", chi: "χ", psi: "ψ", omega: "ω", Gamma: "Γ",
    Delta: "Δ", Theta: "Θ", Lambda: "Λ", Pi: "Π", Sigma: "Σ", Phi: "Φ", Psi: "Ψ", Omega: "Ω",
    partial: "∂", nabla: "∇", cdot: "·", times: "×", odot: "⊙", otimes: "⊗", sum: "Σ", prod: "Π",
    infty: "∞", le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠", neq: "≠", approx: "≈", sim: "∼",
    propto: "∝", to: "→", rightarrow: "→", Rightarrow: "⇒", leftarrow: "←", mapsto: "↦",
    longrightarrow: "→", xrightarrow: "→", in: "∈", top: "ᵀ", ldots: "…", cdots: "⋯", dots: "…", pm: "±",
    lVert: "‖", rVert: "‖", Vert: "‖", lvert: "|", rvert: "|", mid: "|", langle: "⟨",
    rangle: "⟩", circ: "∘", ell: "ℓ", forall: "∀", exists: "∃", lfloor: "⌊", rfloor: "⌋",
    lceil: "⌈", rceil: "⌉", sqrt: "√", quad: " ", qquad: " ", max: "max", min: "min",
    exp: "exp", log: "log", tanh: "tanh", softmax: "softmax", arg: "arg", det: "det",
  };
  const SCRIPTS = {
    "^": { 0: "⁰", 1: "¹", 2: "²", 3: "³", 4: "⁴", 5: "⁵", 6: "⁶", 7: "⁷", 8: "⁸", 9: "⁹",
           "-": "⁻", "+": "⁺", T: "ᵀ", "ᵀ": "ᵀ", n: "ⁿ", i: "ⁱ" },
    _: { 0: "₀", 1: "₁", 2: "₂", 3: "₃", 4: "₄", 5: "₅", 6: "₆", 7: "₇", 8: "₈", 9: "₉",
         "-": "₋", "+": "₊", i: "ᵢ", j: "ⱼ", k: "ₖ", t: "ₜ", o: "ₒ" },
  };

  function texToText(tex) {
    let s = tex.trim().replace(/^\\[(\[]|\\[)\]]$/g, "").replace(/^\$+|\$+$/g, "");
    s = s.replace(/\\(?:begin|end)\{[^{}]*\}/g, " ").replace(/\\\\/g, "; ").replace(/&/g, "");
    s = s.replace(/\\(?:left|right|big|Big|bigg|Bigg)\b/g, "").replace(/\\[,;:! ]/g, " ");
    s = s.replace(/\\mathbb\s*\{R\}/g, "ℝ");
    s = s.replace(/\\(hat|widehat|tilde|widetilde|bar|overline)\s*\{?([A-Za-z])\}?/g, (m, accent, x) =>
      x + { hat: "\u0302", widehat: "\u0302", tilde: "\u0303", widetilde: "\u0303" }[accent] || x + "\u0304");
    for (let before = ""; before !== s; ) { // font and text commands, innermost first
      before = s;
      s = s.replace(/\\(?:mathrm|mathbf|mathit|mathsf|mathcal|mathtt|text|textrm|textbf|operatorname|boldsymbol|bm)\s*\{([^{}]*)\}/g, "$1");
    }
    // a command ends at a space, which is not the formula's: \partial L is ∂L (an operator keeps its spaces)
    s = s.replace(/\\([A-Za-z]+)( ?)/g, (m, name, space) =>
      name === "frac" ? m : (SYMBOLS[name] ?? name) + (/^(partial|nabla|sqrt|top)$/.test(name) ? "" : space));
    s = s.replace(/([\^_])(?:\{([^{}]*)\}|(\S))/g, (m, mark, group, one) => {
      const body = group ?? one, table = SCRIPTS[mark];
      const all = [...body].every((c) => table[c]);
      return all ? [...body].map((c) => table[c]).join("") : mark + (body.length > 1 ? `(${body})` : body);
    });
    const part = (x) => (/^[^\s+\-]+$/.test(x.trim()) ? x.trim() : `(${x.trim()})`);
    for (let before = ""; before !== s; ) {
      before = s;
      s = s.replace(/\\frac ?\{([^{}]*)\}\s*\{([^{}]*)\}/g, (m, a, b) => `${part(a)}/${part(b)}`);
    }
    return s.replace(/[{}]/g, "").replace(/\\/g, "").replace(/\s+/g, " ").trim();
  }

  function plainFormulasInSnippets() {
    if (typeof Search === "undefined" || !Search.htmlToText) return;
    const toText = Search.htmlToText;
    Search.htmlToText = (html, anchor) => {
      const doc = new DOMParser().parseFromString(html, "text/html");
      for (const m of doc.querySelectorAll(".math")) m.textContent = " " + texToText(m.textContent) + " ";
      return toText(doc.documentElement.outerHTML, anchor);
    };
  }

  ready(() => {
    plainFormulasInSnippets();
    translateAsides();
    keepSectionOnLanguageSwitch();
    markAll();
    let timer = null;
    window.addEventListener("resize", () => {
      clearTimeout(timer);
      timer = setTimeout(markAll, 150);
    });
    closeDrawersOnLinks();
  });
})();
