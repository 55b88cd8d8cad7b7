// gtopk-lab's front-end module for ThreadSafeFigureWidget (gtopk_lab/plotting/widget_sync.py).
//
// Why: anywidget gives a model 2 s from its creation to import its module and run the
// module's `initialize`; a model that takes longer never applies another message from
// the kernel (its comm handler awaits a promise that has rejected), so its views keep the
// figure of the widget's first state, empty, forever. plotly's FigureWidget module is its
// 5 MB bundle, imported anew for every widget: 2 s on a quiet 2-core machine, 5-9 s on a
// loaded one.
//
// 1. This module is small, so anywidget imports it at once. `initialize` starts importing
//    plotly's bundle (the widget's `_plotly_esm`) and returns without waiting for it, so
//    the model is ready in time and applies every message from then on.
// 2. The bundle is imported once per page and plotly version and shared by every widget
//    of this class (plotly's own widget imports and evaluates one copy per widget).
// 3. Once it has loaded, plotly's widget is initialized on this model, and `render` (which
//    waits for it) draws from the model's current whole state, `_widget_data` and
//    `_widget_layout`, which the kernel re-sends after every batch of deltas
//    (widget_sync.resync_widget_state): deltas that reached the model before plotly's
//    listeners existed are in it.

const bundles = (globalThis.__gtopkLabPlotlyBundles ??= new Map());

function plotlyBundle(model) {
  const version = model.get("_plotly_version");
  let bundle = bundles.get(version);
  if (bundle === undefined) {
    const url = URL.createObjectURL(new Blob([model.get("_plotly_esm")], { type: "text/javascript" }));
    bundle = import(/* webpackIgnore: true */ url)
      .finally(() => URL.revokeObjectURL(url))
      .catch((error) => {
        bundles.delete(version); // the next widget tries again
        throw error;
      });
    bundles.set(version, bundle);
  }
  return bundle;
}

export default () => {
  let plotly; // plotly's widget definition for this model, once initialized
  let loaded;
  return {
    initialize({ model }) {
      loaded = plotlyBundle(model).then(async (mod) => {
        const definition = typeof mod.default === "function" ? await mod.default() : mod.default;
        await definition.initialize?.({ model });
        plotly = definition;
      });
      loaded.catch((error) => console.error("[gtopk-lab] plotly's widget module failed to load", error));
      // not returned: anywidget would wait for it, past the model's 2 s
    },
    async render({ model, el }) {
      await loaded;
      return plotly.render({ model, el });
    },
  };
};
