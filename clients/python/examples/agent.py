import asyncio, os
from langchain.agents import create_agent
from langgraph.checkpoint.memory import InMemorySaver
from summarizer_client import SummarizerClient, SummarizerMiddleware, recall_tool

async def main(model="openai:gpt-4.1-mini", subject="summarizer.turn.starting", recall_subject="summarizer.recall"):
    async with SummarizerClient(database_url=os.environ["DATABASE_URL"], subject=subject,
                                recall_subject=recall_subject) as client:
        agent = create_agent(model, tools=[recall_tool(client)],  # what compaction removed, on demand
                             checkpointer=InMemorySaver(),
                             middleware=[SummarizerMiddleware(client)])  # compaction before each call
        config = {"configurable": {"thread_id": "incident-1204"}}
        for question in ["Why is checkout-api slow?", "Could it be the DB pool?"]:
            result = await agent.ainvoke({"messages": [("user", question)]}, config)
            print(result["messages"][-1].content)

if __name__ == "__main__":
    asyncio.run(main())
